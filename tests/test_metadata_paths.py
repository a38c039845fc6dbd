"""--metadata path spellings: rows written with a leading ``./`` or as absolute
paths under SRC (``find "$PWD/SRC"``, also through a symlinked ``$PWD``) match the file's relpath,
for the group column and the split column alike; rows that still match no file are shown next
to a SRC relpath in the error. Real photos from examples/flowers-sample."""
from __future__ import annotations

import csv
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from shardkit.sources.csvlist import (
    lacking_metadata_error, match_group_metadata, match_split_metadata)
from shardkit.errors import SourceError
from shardkit.sources.folder import scan_folder


def _real_metadata(sample_dir: Path) -> dict[str, str]:
    """relpath -> group_flickr_user of the embedded sample (its own metadata.csv)."""
    with open(sample_dir / "metadata.csv", newline="", encoding="utf-8") as f:
        return {r["path"]: r["group_flickr_user"] for r in csv.DictReader(f)}


@pytest.fixture()
def src(sample_dir, tmp_path) -> Path:
    """SRC/<class>/<photo>.jpg: the first 2 real photos of each of the 5 classes."""
    root = tmp_path / "data" / "flowers"
    for c in sorted(d for d in sample_dir.iterdir() if d.is_dir()):
        (root / c.name).mkdir(parents=True)
        for p in sorted(c.glob("*.jpg"))[:2]:
            shutil.copyfile(p, root / c.name / p.name)
    return root


def _write(path: Path, header: list[str], rows: list[list[str]]) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([header, *rows])
    return path


def _spell(i: int, rel: str, root: Path) -> str:
    """Row i's spelling of ``rel``: as is, ./, absolute under ``root``, Windows .\\, doubled /."""
    return [rel, f"./{rel}", f"{root}/{rel}", ".\\" + rel.replace("/", "\\"),
            f"././{rel.replace('/', '//')}"][i % 5]


def test_dot_slash_and_absolute_rows_match_groups_and_splits(src, sample_dir, tmp_path):
    items = scan_folder(src).items
    rels = [it.relpath for it in items]
    assert len(rels) == 10
    truth = _real_metadata(sample_dir)
    splits = ["train", "val"] * 5
    meta = _write(tmp_path / "meta.csv", ["path", "user", "split"],
                  [[_spell(i, r, src), truth[r], splits[i]] for i, r in enumerate(rels)])
    grouped, lacking = match_group_metadata(items, meta, "user")
    assert lacking == []
    assert {it.relpath: it.group for it in grouped} == {r: truth[r] for r in rels}
    with_split, lacking, mapping = match_split_metadata(items, meta, "split")
    assert lacking == [] and mapping == {"train": "train", "val": "val"}
    assert [it.split for it in with_split] == splits
    assert [it.group for it in grouped] == [truth[r] for r in rels]


def test_absolute_rows_through_a_symlinked_folder_match_either_way(src, sample_dir, tmp_path):
    link = tmp_path / "link"
    link.symlink_to(src.parent, target_is_directory=True)  # $PWD reached through a symlink
    truth = _real_metadata(sample_dir)
    for scan_root, written_root in ((src, link / "flowers"), (link / "flowers", src)):
        items = scan_folder(scan_root).items
        meta = _write(tmp_path / "meta.csv", ["path", "user"],
                      [[f"{written_root}/{it.relpath}", truth[it.relpath]] for it in items])
        grouped, lacking = match_group_metadata(items, meta, "user")
        assert lacking == [], (scan_root, written_root)
        assert [it.group for it in grouped] == [truth[it.relpath] for it in items]


def test_a_symlinked_file_keeps_its_own_row(src, tmp_path):
    target = sorted((src / "roses").glob("*.jpg"))[0]
    (src / "daisy" / "alias.jpg").symlink_to(target)
    items = scan_folder(src).items
    rels = [it.relpath for it in items]
    assert "daisy/alias.jpg" in rels
    meta = _write(tmp_path / "meta.csv", ["path", "user"],
                  [[f"{src}/{r}", "alias" if r == "daisy/alias.jpg" else r] for r in rels])
    grouped, lacking = match_group_metadata(items, meta, "user")
    assert lacking == []
    assert {it.relpath: it.group for it in grouped} == {
        r: "alias" if r == "daisy/alias.jpg" else r for r in rels}


def test_two_spellings_of_one_file_with_different_groups_are_an_error(src, tmp_path):
    items = scan_folder(src).items
    rel = items[0].relpath
    meta = _write(tmp_path / "meta.csv", ["path", "user"],
                  [[rel, "ann"], [f"./{rel}", "bob"], [f"{src}/{rel}", "ann"]])
    with pytest.raises(SourceError, match=f"several 'user' values to 1: '{rel}' path"):
        match_group_metadata(items, meta, "user")


@pytest.mark.parametrize("written", ["/data/flowers/{rel}", "flowers/{rel}", "{rel_upper}"])
def test_unmatched_rows_are_shown_next_to_a_src_relpath(src, tmp_path, written):
    """Rows from another machine, relative to SRC's parent, or with the case changed."""
    items = scan_folder(src).items
    rels = [it.relpath for it in items]
    rows = [[written.format(rel=r, rel_upper=r.upper()), "g"] for r in rels]
    meta = _write(tmp_path / "meta.csv", ["path", "user"], rows)
    _, lacking = match_group_metadata(items, meta, "user")
    assert [it.relpath for it in lacking] == rels
    # the error the packer raises for them (shardkit.packer.scan)
    msg = str(lacking_metadata_error(meta, "user", [it.relpath for it in lacking], root=src,
                                     known=rels))
    assert msg.startswith(f"metadata CSV {str(meta)!r} has no row or an empty 'user' for 10 "
                          f"file(s). The CSV's path {rows[0][0]!r} matches no file; compare the "
                          f"file {rels[0]!r} under {src}: paths must be relative to SRC like "
                          "that, may start with './', or be absolute under SRC. Files without "
                          f"a row: 10: {rels[0]!r}, ")  # the hint before the long listing
    assert "\n" not in msg


def test_example_pairs_a_row_with_the_same_file_name_and_skips_matched_rows(src, tmp_path):
    items = scan_folder(src).items
    rels = [it.relpath for it in items]
    # rows 0-7 match; row 8 sits one folder too deep; the last file has no row at all
    rows = [[r, "g"] for r in rels[:8]] + [[f"extra/{rels[8]}", "g"]]
    meta = _write(tmp_path / "meta.csv", ["path", "user"], rows)
    err = lacking_metadata_error(meta, "user", rels[8:], root=src, known=rels)
    assert f"The CSV's path 'extra/{rels[8]}' matches no file; compare the file {rels[8]!r} " \
        f"under {src}:" in str(err)
    # without ``known`` the matched rows cannot be told apart: only a same-name row is shown
    assert f"'extra/{rels[8]}'" in str(lacking_metadata_error(meta, "user", rels[8:]))
    assert str(lacking_metadata_error(meta, "user", rels[9:])).endswith(
        f"Files without a row: 1: {rels[9]!r}")
    # every row matches a file and one file has no row: no row to compare, nothing added
    meta = _write(tmp_path / "meta.csv", ["path", "user"], [[r, "g"] for r in rels[:9]])
    _, lacking = match_group_metadata(items, meta, "user")
    err = lacking_metadata_error(meta, "user", [it.relpath for it in lacking], root=src,
                                 known=rels)
    assert str(err) == (f"metadata CSV {str(meta)!r} has no row or an empty 'user' for 1 "
                        f"file(s). Files without a row: 1: {rels[9]!r}")


def test_pack_cli_joins_dot_slash_and_absolute_rows_for_group_and_split_column(
        src, sample_dir, tmp_path):
    from shardkit.cli import main
    from shardkit.dataset.manifest import load_manifest, read_split_records

    truth = _real_metadata(sample_dir)
    rels = [it.relpath for it in scan_folder(src).items]
    splits = {r: ("train", "val")[i % 2] for i, r in enumerate(rels)}
    link = tmp_path / "pwd"
    link.symlink_to(src.parent, target_is_directory=True)  # `find "$PWD/flowers"` via a link
    rows = [[(f"./{r}", f"{link}/flowers/{r}", f"{src}/{r}")[i % 3], truth[r], splits[r]]
            for i, r in enumerate(rels)]
    meta = _write(tmp_path / "meta.csv", ["path", "user", "split"], rows)
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["pack", str(src), str(out), "--metadata", str(meta),
                                    "--group-column", "user", "--split-column", "split",
                                    "--no-progress"])
    assert res.exit_code == 0, res.output + repr(res.exception)
    man = load_manifest(out)
    got = {r["path"]: (r["group"], s) for s in man["splits"]
           for r in read_split_records(out, s)}
    assert got == {r: (truth[r], splits[r]) for r in rels}
    assert os.path.basename(man["split"]["given"]["csv"]) == "meta.csv"
