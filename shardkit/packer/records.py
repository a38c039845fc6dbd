"""The check records of a pack, held in columns: what the driver keeps per file between step 3
(check) and step 6 (write).

:func:`shardkit.packer.check._check_one` returns one dict per file; a list of those dicts costs the
driver ~600 bytes per file (a dict of a dozen keys, a 64-character hex digest, a list of
warnings, boxed ints), which is 60 GB for 100 M files (benchmarks/README.md, "Packing on Ray").
:class:`CheckRecords` stores the same records in NumPy columns (the digest as 32 raw bytes, the
extension and storage rule as one-byte codes, sizes as fixed-width ints) and keeps only the rare
fields (a reject's reason, decoder warnings, the degenerate reason, the original size of a
downscaled image) in a sparse table. Normalised bytes (``data``: a transcoded PNG, a
``--max-side`` re-encode) are not held in memory at all: they go to an unnamed temporary file
(in ``$TMPDIR``, removed by the OS when the table is closed or the process ends) and are read
back when the write step asks for them, so a pack that re-encodes every image no longer needs
the whole dataset in RAM.

Reading ``records[i]`` rebuilds the dict :func:`~shardkit.packer.check._check_one` returned, with the
same keys and values (``data`` read back from the spill file), so the split planner and the
writers read it as before; ``records[i]`` is None for a file not checked yet.
"""
from __future__ import annotations

import os
import tempfile
from typing import Iterator, Sequence

import numpy as np

__all__ = ["CheckRecords"]

_UNSET, _REJECTED, _REJECTED_READ, _ACCEPTED = 0, 1, 2, 3  # kinds of record
_ACCEPTED_KEYS = {"ok", "sha256", "size", "ext", "rule", "width", "height", "warnings",
                  "degenerate", "phash", "data", "original_width", "original_height"}


class CheckRecords(Sequence):
    """The check record of each of ``n`` files, by position; columns inside (module doc).

    ``records[i] = record`` stores the dict of :func:`shardkit.packer.check._check_one` (any other
    key raises KeyError: a new field must get a column or a sparse slot here);
    ``records[i]`` returns an equal dict, or None when position ``i`` is not set.

    Memory: 60 bytes per file plus the rare fields; normalised bytes live in the spill file.
    """

    def __init__(self, n: int):
        self._kind = np.zeros(n, np.uint8)
        self._sha = np.zeros(n, "S32")
        self._size = np.zeros(n, np.int64)
        self._ext = np.zeros(n, np.uint8)  # code into self._codes["ext"]
        self._rule = np.zeros(n, np.uint8)
        self._wh = np.zeros((n, 2), np.int32)
        self._phash = np.zeros(n, np.uint64)
        self._has_phash = np.zeros(n, bool)
        self._codes: dict[str, list[str]] = {"ext": [], "rule": []}
        self._sparse: dict[int, dict] = {}  # reason, warnings, degenerate, original size, data
        self._spill = None  # the temporary file of normalised bytes
        self._spill_end = 0

    def __len__(self) -> int:
        return len(self._kind)

    @property
    def unset(self) -> list[int]:
        """Positions not set yet."""
        return np.flatnonzero(self._kind == _UNSET).tolist()

    def _code(self, column: str, value: str) -> int:
        codes = self._codes[column]
        if value not in codes:
            if len(codes) == 255:
                raise ValueError(f"more than 255 distinct {column} values")
            codes.append(value)
        return codes.index(value) + 1

    def __setitem__(self, i: int, rec: dict) -> None:
        i = int(i) + (len(self) if i < 0 else 0)
        extra = {}
        if "sha256" in rec:
            self._sha[i] = bytes.fromhex(rec["sha256"])
            self._size[i] = rec["size"]
        if not rec["ok"]:
            unknown = set(rec) - {"ok", "reason", "sha256", "size"}
            if unknown:
                raise KeyError(f"check record field(s) {sorted(unknown)} have no column")
            self._kind[i] = _REJECTED_READ if "sha256" in rec else _REJECTED
            self._sparse[i] = {"reason": rec["reason"]}
            return
        unknown = set(rec) - _ACCEPTED_KEYS
        if unknown:
            raise KeyError(f"check record field(s) {sorted(unknown)} have no column")
        self._ext[i] = self._code("ext", rec["ext"])
        self._rule[i] = self._code("rule", rec["rule"])
        self._wh[i] = rec["width"], rec["height"]
        if rec["phash"] is not None:
            self._phash[i], self._has_phash[i] = rec["phash"], True
        if rec["warnings"]:
            extra["warnings"] = list(rec["warnings"])
        if rec["degenerate"] is not None:
            extra["degenerate"] = rec["degenerate"]
        if "original_width" in rec:
            extra["original"] = (rec["original_width"], rec["original_height"])
        if "data" in rec:
            extra["data"] = self._spill_write(rec["data"])
        self._kind[i] = _ACCEPTED
        if extra:
            self._sparse[i] = extra
        else:
            self._sparse.pop(i, None)

    def __getitem__(self, i: int) -> dict | None:
        return self._record(i, with_data=True)

    def meta(self, i: int) -> dict | None:
        """``self[i]`` without ``data`` (no read of the spill file): for the planner and the
        summary, which never need the bytes."""
        return self._record(i, with_data=False)

    def stored_size(self, i: int) -> int:
        """Bytes a packed file stores (``len(self[i]["data"])`` when normalised, else its
        ``size``), without reading the spill file; ``i`` must be accepted."""
        i = int(i) + (len(self) if i < 0 else 0)
        spilled = self._sparse.get(i, {}).get("data")
        return int(self._size[i]) if spilled is None else int(spilled[1])

    def _record(self, i: int, with_data: bool) -> dict | None:
        i = int(i) + (len(self) if i < 0 else 0)
        kind = self._kind[i]
        if kind == _UNSET:
            return None
        out: dict = {}
        if kind != _REJECTED:
            out.update(sha256=self._sha[i].ljust(32, b"\0").hex(), size=int(self._size[i]))
        extra = self._sparse.get(i, {})
        if kind != _ACCEPTED:
            return {**out, "ok": False, "reason": extra["reason"]}
        out.update(degenerate=extra.get("degenerate"),
                   phash=int(self._phash[i]) if self._has_phash[i] else None, ok=True,
                   ext=self._codes["ext"][self._ext[i] - 1],
                   rule=self._codes["rule"][self._rule[i] - 1],
                   width=int(self._wh[i, 0]), height=int(self._wh[i, 1]),
                   warnings=list(extra.get("warnings", ())))
        if "original" in extra:
            out["original_width"], out["original_height"] = extra["original"]
        if "data" in extra and with_data:
            out["data"] = self._spill_read(*extra["data"])
        return out

    def __iter__(self) -> Iterator[dict | None]:
        return (self[i] for i in range(len(self)))

    # ----------------------------------------------------------------- normalised bytes
    def _spill_write(self, data: bytes) -> tuple[int, int]:
        if self._spill is None:
            self._spill = tempfile.TemporaryFile(prefix="shardkit-pack-data-")
        offset = self._spill_end
        os.pwrite(self._spill.fileno(), data, offset)
        self._spill_end += len(data)
        return offset, len(data)

    def _spill_read(self, offset: int, length: int) -> bytes:
        data = os.pread(self._spill.fileno(), length, offset)
        if len(data) != length:
            raise OSError(f"the pack's temporary file of normalised images is short at offset "
                          f"{offset} ({len(data)} of {length} bytes): was $TMPDIR cleaned?")
        return data

    def close(self) -> None:
        """Removes the temporary file (its bytes cannot be read afterwards)."""
        if self._spill is not None:
            self._spill.close()
            self._spill = None
