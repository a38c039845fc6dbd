"""The driver's check records in columns (shardkit.packer.records): every record the check returns
on real photos and awkward files reads back equal, normalised bytes come back from the spill
file, and a pack holds a fraction of the memory of a list of dicts."""
import tracemalloc

import pytest

import shardkit.packer.check as pack_check
from shardkit.packer.records import CheckRecords

from conftest import SAMPLE, make_awkward


def _jobs(paths, **kw):
    opts = dict(max_pixels=178_956_970, strict=False, want_hash=True, max_side=None,
                jpeg_quality=95)
    opts.update(kw)
    return [(str(p), str(p), opts["max_pixels"], opts["strict"], opts["want_hash"],
             opts["max_side"], opts["jpeg_quality"]) for p in paths]


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """The check's own dicts for sample photos, made awkward files (rejects with and without a
    digest, transcoded PNGs, EXIF rotations) and missing files, plain and with --max-side."""
    folder = tmp_path_factory.mktemp("awk")
    awkward = []
    for name, data in sorted(make_awkward().items()):
        awkward.append(folder / name.replace("/", "_"))
        awkward[-1].write_bytes(data)
    photos = sorted(SAMPLE.rglob("*.jpg"))[:30]
    paths = photos + awkward + [folder / "missing.jpg"]
    recs = [pack_check._check_one(j) for j in _jobs(paths)]
    recs += [pack_check._check_one(j) for j in _jobs(photos[:5], max_side=128, strict=True,
                                                    want_hash=False)]
    return recs


def test_every_record_reads_back_equal(records):
    kinds = {(r["ok"], "sha256" in r, "data" in r, bool(r.get("warnings")),
              "original_width" in r) for r in records}
    assert (False, False, False, False, False) in kinds  # unreadable: no digest
    assert (False, True, False, False, False) in kinds   # read, then rejected
    assert (True, True, True, False, False) in kinds     # normalised bytes to store
    assert (True, True, True, False, True) in kinds      # downscaled: original size kept
    table = CheckRecords(len(records) + 1)
    for i, rec in enumerate(records):
        table[i] = rec
    assert table.unset == [len(records)] and table[len(records)] is None
    for i, rec in enumerate(records):
        assert table[i] == rec, i
        meta = dict(rec)
        meta.pop("data", None)
        assert table.meta(i) == meta
    assert [table.stored_size(i) for i, r in enumerate(records) if "data" in r] == [
        len(r["data"]) for r in records if "data" in r]
    assert list(table) == records + [None]


def test_a_digest_ending_in_zero_bytes_survives():
    rec = {"ok": False, "reason": "not an image", "sha256": "ab" * 30 + "0000", "size": 3}
    table = CheckRecords(1)
    table[0] = rec
    assert table[0] == rec


def test_an_unknown_field_is_refused():
    table = CheckRecords(1)
    with pytest.raises(KeyError, match="colour"):
        table[0] = {"ok": False, "reason": "x", "colour": "red"}


def test_columns_hold_a_fraction_of_the_dicts(records):
    photos = [r for r in records if r["ok"] and "data" not in r]
    tracemalloc.start()  # dicts as the check returns them: each with its own digest and list
    many = [dict(photos[k % len(photos)], sha256=f"{k:064x}", warnings=[])
            for k in range(20_000)]
    dict_bytes, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    tracemalloc.start()
    table = CheckRecords(len(many))
    for i, rec in enumerate(many):
        table[i] = rec
    table_bytes, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert table[12_345] == many[12_345]
    per_dict, per_row = dict_bytes / len(many), table_bytes / len(many)
    assert per_row < 100 and per_dict > 4 * per_row, (per_row, per_dict)  # 60 B vs 449 B
