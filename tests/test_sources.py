"""shardkit.sources (folder, csvlist, groups, layouts): ImageFolder and CSV discovery, system
entries, Unicode, symlinks, group rules."""
from __future__ import annotations

import collections
import os
import re
import unicodedata
from pathlib import Path

import pytest

from shardkit.errors import ConfigError, SourceError
from shardkit.sources.layouts import class_order, map_split_names, numeric_order_note, order_splits
from shardkit.sources.items import SourceItem
from shardkit.sources.csvlist import (
    lacking_metadata_error, match_group_metadata, match_split_metadata, scan_csv)
from shardkit.sources.groups import match_group_regex, unmatched_regex_error
from shardkit.sources.folder import scan_folder

CAFE_NFC = unicodedata.normalize("NFC", "Café")
CAFE_NFD = unicodedata.normalize("NFD", "Café")


def _touch(root: Path, rel: str, data: bytes = b"x") -> Path:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    return p


@pytest.fixture()
def messy(tmp_path) -> Path:
    root = tmp_path / "src"
    for rel in ["cat/a.jpg", "cat/sub/deeper/b.JPG", "cat/.hidden.jpg", "cat/._a.jpg",
                "cat/.ipynb_checkpoints/a-checkpoint.jpg", "__MACOSX/cat/._a.jpg", ".DS_Store",
                "LICENSE.txt", "metadata.csv", "dog/Thumbs.db", "dog/DESKTOP.INI",
                "dog/my photo.v2.final.JPEG", "dog/notes.txt", ".git/HEAD", "dog/.DS_Store"]:
        _touch(root, rel)
    (root / "empty").mkdir()
    return root


def test_messy_tree_items_and_ignored(messy):
    result = scan_folder(messy)
    assert [(i.relpath, i.label) for i in result.items] == [
        ("cat/a.jpg", "cat"), ("cat/sub/deeper/b.JPG", "cat"),
        ("dog/my photo.v2.final.JPEG", "dog"), ("dog/notes.txt", "dog")]
    assert all(Path(i.path).is_absolute() and Path(i.path).is_file() for i in result.items)
    assert all(i.group is None for i in result.items)
    assert result.ignored == [
        (".DS_Store", "hidden entry (dot-name)"),
        (".git", "hidden entry (dot-name)"),
        ("LICENSE.txt", "file beside the class folders (not a sample)"),
        ("__MACOSX", "macOS archive metadata (__MACOSX)"),
        ("cat/._a.jpg", "macOS resource fork (._*)"),
        ("cat/.hidden.jpg", "hidden entry (dot-name)"),
        ("cat/.ipynb_checkpoints", "Jupyter checkpoint folder"),
        ("dog/.DS_Store", "hidden entry (dot-name)"),
        ("dog/DESKTOP.INI", "Windows folder settings (desktop.ini)"),
        ("dog/Thumbs.db", "Windows thumbnail cache (Thumbs.db)"),
        ("empty", "empty class folder (no files)"),
        ("metadata.csv", "file beside the class folders (not a sample)"),
    ]
    assert result.missing == [] and result.kind == "folder" and result.root == str(messy)


def test_scan_is_deterministic(messy):
    assert scan_folder(messy) == scan_folder(str(messy) + "/")


def test_nfd_and_nfc_class_folders_are_one_class(tmp_path):
    root = tmp_path / "src"
    _touch(root, f"{CAFE_NFD}/x.jpg")
    _touch(root, f"{CAFE_NFC}/y.jpg")
    _touch(root, f"{CAFE_NFD}/{CAFE_NFD} 1.jpg")
    _touch(root, " roses /r.jpg")
    result = scan_folder(root)
    assert sorted({i.label for i in result.items}) == ["Café", "roses"]
    assert {i.label for i in result.items} == {CAFE_NFC, "roses"}
    assert all(unicodedata.is_normalized("NFC", i.relpath) for i in result.items)
    assert f"{CAFE_NFC}/{CAFE_NFC} 1.jpg" in [i.relpath for i in result.items]
    on_disk = [i.path for i in result.items if i.relpath.endswith(" 1.jpg")][0]
    assert CAFE_NFD in on_disk and os.path.exists(on_disk)  # real path kept
    assert [i.relpath for i in result.items if i.label == "roses"] == [" roses /r.jpg"]
    assert result.warnings == [  # one class, two spellings: said, both named (ascii escapes)
        "class folders 'Cafe\\u0301' and 'Caf\\xe9' are one class 'Café' after Unicode NFC "
        "normalisation and stripping spaces: their files are merged"]
    assert result.layout == "class" and result.given_splits == {}


def test_nfc_collision_is_an_error(tmp_path):
    root = tmp_path / "src"
    _touch(root, f"{CAFE_NFD}/same.jpg")
    _touch(root, f"{CAFE_NFC}/same.jpg")
    with pytest.raises(SourceError, match="Café/same.jpg"):
        scan_folder(root)


def test_symlinks(tmp_path):
    root = tmp_path / "src"
    target = _touch(tmp_path, "elsewhere/photo.jpg", b"abc")
    _touch(root, "cat/a.jpg")
    os.symlink(target, root / "cat" / "link.jpg")
    os.symlink(tmp_path / "nowhere.jpg", root / "cat" / "broken.jpg")
    os.symlink(root / "cat", root / "cat" / "loop")
    os.symlink(tmp_path / "elsewhere", root / "linked_class")
    result = scan_folder(root)
    assert [(i.relpath, i.label) for i in result.items] == [
        ("cat/a.jpg", "cat"), ("cat/link.jpg", "cat"), ("linked_class/photo.jpg", "linked_class")]
    link = result.items[1]
    assert link.path == str(root / "cat" / "link.jpg") and Path(link.path).read_bytes() == b"abc"
    assert [i.relpath for i in result.missing] == ["cat/broken.jpg"]
    assert ("cat/loop", "symlink loop (points to a folder being walked)") in result.ignored


def test_file_symlink_loops_are_missing_with_the_loop_as_reason(tmp_path):
    """A loop of file links (a.jpg -> b.jpg -> a.jpg, a link to itself) cannot be followed
    (ELOOP): each link is a missing entry whose reason names the loop; the scan goes on, also
    for a looped entry beside the class folders and a CSV row naming a looped link."""
    root = tmp_path / "src"
    _touch(root, "cat/real.jpg")
    os.symlink("b.jpg", root / "cat" / "a.jpg")
    os.symlink("a.jpg", root / "cat" / "b.jpg")
    os.symlink("self.jpg", root / "cat" / "self.jpg")
    os.symlink("y", root / "x")  # beside the class folders: x -> y -> x
    os.symlink("x", root / "y")
    result = scan_folder(root)
    assert [i.relpath for i in result.items] == ["cat/real.jpg"]
    assert [i.relpath for i in result.missing] == ["cat/a.jpg", "cat/b.jpg", "cat/self.jpg"]
    assert result.missing_reasons == {"cat/a.jpg": "symlink loop: a.jpg -> b.jpg -> a.jpg",
                                      "cat/b.jpg": "symlink loop: b.jpg -> a.jpg -> b.jpg",
                                      "cat/self.jpg": "symlink loop: self.jpg -> self.jpg"}
    assert ("x", "symlink loop: x -> y -> x, beside the class folders") in result.ignored
    listing = tmp_path / "list.csv"
    listing.write_text("path,label\nsrc/cat/real.jpg,cat\nsrc/cat/a.jpg,cat\n")
    rows = scan_csv(listing)
    assert [i.relpath for i in rows.items] == ["src/cat/real.jpg"]
    assert rows.missing_reasons == {"src/cat/a.jpg": "symlink loop: a.jpg -> b.jpg -> a.jpg"}


def test_empty_or_classless_root_raises(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SourceError, match=str(empty)):
        scan_folder(empty)
    flat = tmp_path / "flat"
    _touch(flat, "a.jpg")
    _touch(flat, "b.jpg")
    with pytest.raises(SourceError, match="no class folder.*'a.jpg', 'b.jpg'"):
        scan_folder(flat)
    with pytest.raises(SourceError, match="does not exist"):
        scan_folder(tmp_path / "absent")


def test_sample_folder(sample_dir):
    """The embedded 200-photo sample: classes, files beside them, photographer groups."""
    result = scan_folder(sample_dir)
    assert len(result.items) == 200
    assert result.ignored == [("LICENSE.txt", "file beside the class folders (not a sample)"),
                              ("metadata.csv", "file beside the class folders (not a sample)")]
    counts = collections.Counter(i.label for i in result.items)
    assert counts == {"daisy": 40, "dandelion": 44, "roses": 32, "sunflowers": 40, "tulips": 44}
    assert [i.relpath for i in result.items] == sorted(i.relpath for i in result.items)
    grouped, lacking = match_group_metadata(result.items, sample_dir / "metadata.csv",
                                            "group_flickr_user")
    assert lacking == []
    assert len({i.group for i in grouped}) == 120
    assert max(collections.Counter(i.group for i in grouped).values()) == 9
    assert [i.relpath for i in grouped] == [i.relpath for i in result.items]


def test_flowers_folder(flowers_dir):
    """The full set (../shared/data/flowers): 1,839 photos, 791 photographers."""
    result = scan_folder(flowers_dir)
    assert len(result.items) == 1839
    assert result.ignored == [("LICENSE.txt", "file beside the class folders (not a sample)"),
                              ("metadata.csv", "file beside the class folders (not a sample)")]
    counts = collections.Counter(i.label for i in result.items)
    assert counts == {"daisy": 361, "dandelion": 409, "roses": 276, "sunflowers": 365,
                      "tulips": 428}
    grouped, lacking = match_group_metadata(result.items, flowers_dir / "metadata.csv",
                                            "group_flickr_user")
    assert lacking == []
    assert len({i.group for i in grouped}) == 791
    assert max(collections.Counter(i.group for i in grouped).values()) == 54


def test_sample_metadata_as_csv_source(sample_dir):
    from_csv = scan_csv(sample_dir / "metadata.csv")
    from_folder = scan_folder(sample_dir)
    assert from_csv.kind == "csv" and from_csv.missing == [] and len(from_csv.items) == 200
    assert [(i.path, i.relpath, i.label) for i in from_csv.items] == [
        (i.path, i.relpath, i.label) for i in from_folder.items]


def test_csv_paths_labels_groups_and_missing(tmp_path):
    root = tmp_path / "imgs"
    _touch(root, "a/1.jpg")
    _touch(root, f"b/{CAFE_NFC}.jpg")
    listing = tmp_path / "lists" / "list.csv"
    listing.parent.mkdir()
    listing.write_text("\ufeffpath,label,group,extra\n"
                       "a/1.jpg, Sunflower ,g1,zz\n"
                       f"b/{CAFE_NFD}.jpg,café,,zz\n"
                       "a/gone.jpg,daisy,g2,zz\n", encoding="utf-8")
    result = scan_csv(listing, root=root)
    assert [(i.relpath, i.label, i.group) for i in result.items] == [
        ("a/1.jpg", "Sunflower", "g1"), (f"b/{CAFE_NFC}.jpg", "café", None)]
    assert Path(result.items[1].path).exists()  # NFD spelling in the CSV found the NFC file
    assert [(i.relpath, i.label) for i in result.missing] == [("a/gone.jpg", "daisy")]
    assert result.root == str(root)
    # without root, paths resolve against the CSV's own folder
    beside = tmp_path / "imgs" / "list.csv"
    beside.write_text("path,label\na/1.jpg,x\n", encoding="utf-8")
    assert scan_csv(beside).items == [SourceItem(str(root / "a" / "1.jpg"), "a/1.jpg", "x")]


@pytest.mark.parametrize("text, match", [
    ("file,label\na.jpg,x\n", r"lacks column\(s\) \['path'\].*found columns \['file', 'label'\]"),
    ("path,label\n", "no rows"),
    ("path,label\na.jpg,\n", "empty path or label.*line 2"),
    ("path,label\na.jpg,x\n./a.jpg,y\n", "share one relative path.*'a.jpg'"),
    ("path,label\nsub,x\n", "folders, not files.*'sub'"),
])
def test_csv_errors(tmp_path, text, match):
    _touch(tmp_path, "a.jpg")
    (tmp_path / "sub").mkdir()
    listing = tmp_path / "list.csv"
    listing.write_text(text, encoding="utf-8")
    with pytest.raises(SourceError, match=match):
        scan_csv(listing)


def _items(*relpaths: str) -> list[SourceItem]:
    return [SourceItem(f"/data/{r}", r, r.split("/")[0]) for r in relpaths]


def test_group_regex_named_and_first_group():
    items = _items("a/subjA_0001.jpg", "a/subjA_0002.jpg", "b/subjB_0001.jpg")
    named, unmatched = match_group_regex(items, r"(?P<cls>\w)/(?P<group>subj[A-Z])_\d+")
    assert [i.group for i in named] == ["subjA", "subjA", "subjB"] and unmatched == []
    first, unmatched = match_group_regex(items, r"/(\w+?)_")
    assert [i.group for i in first] == ["subjA", "subjA", "subjB"] and unmatched == []
    assert [i.relpath for i in first] == [i.relpath for i in items]
    assert all(i.group is None for i in items)  # inputs untouched


def test_group_regex_errors():
    items = _items(*[f"a/x{i:02d}.jpg" for i in range(25)], "a/subjA_1.jpg")
    grouped, unmatched = match_group_regex(items, r"(subj\w)_")
    assert [(i.relpath, i.group) for i in grouped] == [("a/subjA_1.jpg", "subjA")]
    assert unmatched == items[:25]  # the packer raises the error below for those (test_pack.py)
    err = unmatched_regex_error(r"(subj\w)_", [i.relpath for i in unmatched])
    assert isinstance(err, SourceError)
    assert re.search(r"gives no group for 25: 'a/x00.jpg'.*and 5 more", str(err))
    with pytest.raises(ConfigError, match="does not compile"):
        match_group_regex(items, r"(unclosed")
    with pytest.raises(ConfigError, match="no capture group"):
        match_group_regex(items, r"subj")


def test_group_metadata_join_and_errors(tmp_path):
    meta = tmp_path / "meta.csv"
    meta.write_text(f"file,who\na/1.jpg,ann\n{CAFE_NFD}/2.jpg,bob\nz/unused.jpg,cy\n",
                    encoding="utf-8")
    items = _items("a/1.jpg", f"{CAFE_NFC}/2.jpg")
    joined, lacking = match_group_metadata(items, meta, "who", path_column="file")
    assert [i.group for i in joined] == ["ann", "bob"] and lacking == []
    with pytest.raises(ConfigError, match=r"no column 'photographer'; columns: \['file', 'who'\]"):
        match_group_metadata(items, meta, "photographer", path_column="file")
    with pytest.raises(ConfigError, match="no column 'path'"):
        match_group_metadata(items, meta, "who")
    joined, lacking = match_group_metadata(items + _items("b/3.jpg"), meta, "who",
                                           path_column="file")
    assert [i.group for i in joined] == ["ann", "bob"] and lacking == _items("b/3.jpg")
    err = lacking_metadata_error(meta, "who", ["b/3.jpg"], path_column="file")
    assert isinstance(err, SourceError)  # the packer raises it (test_pack.py)
    assert re.search(r"no row or an empty 'who' for 1 file.*Files without a row: 1: 'b/3.jpg'",
                     str(err))
    meta.write_text("path,who\na/1.jpg,ann\na/1.jpg,bob\n", encoding="utf-8")
    with pytest.raises(SourceError, match="several 'who' values to 1: 'a/1.jpg'"):
        match_group_metadata(items[:1], meta, "who")


def test_blank_class_folder_name_is_an_error(tmp_path):
    _touch(tmp_path / "src", "  /a.jpg")
    with pytest.raises(SourceError, match="blank name"):
        scan_folder(tmp_path / "src")


def test_csv_windows_separators(tmp_path):
    _touch(tmp_path, "a/sub/1.jpg")
    listing = tmp_path / "list.csv"
    listing.write_text("path,label\na\\sub\\1.jpg,x\na\\sub\\2.jpg,x\n", encoding="utf-8")
    result = scan_csv(listing)
    assert [(i.path, i.relpath) for i in result.items] == [(str(tmp_path / "a/sub/1.jpg"),
                                                            "a/sub/1.jpg")]
    assert [i.relpath for i in result.missing] == ["a/sub/2.jpg"]


def test_match_group_rules_return_what_gets_no_group(tmp_path):
    items = _items("a/subjA_1.jpg", "a/notes.txt", "b/subjB_2.jpg")
    grouped, unmatched = match_group_regex(items, r"/(subj\w)_")
    assert [(i.relpath, i.group) for i in grouped] == [("a/subjA_1.jpg", "subjA"),
                                                       ("b/subjB_2.jpg", "subjB")]
    assert unmatched == [items[1]]
    with pytest.raises(ConfigError, match="no capture group"):
        match_group_regex(items, r"subj")
    meta = tmp_path / "meta.csv"
    meta.write_text("path,who\na/subjA_1.jpg,ann\nb/subjB_2.jpg,\n", encoding="utf-8")
    grouped, lacking = match_group_metadata(items, meta, "who")
    assert [(i.relpath, i.group) for i in grouped] == [("a/subjA_1.jpg", "ann")]
    assert [i.relpath for i in lacking] == ["a/notes.txt", "b/subjB_2.jpg"]


def test_non_utf8_file_name_round_trips_through_fsencode(tmp_path):
    folder = tmp_path / "src" / "cat"
    folder.mkdir(parents=True)
    with open(os.path.join(os.fsencode(str(folder)), b"caf\xe9_latin1.jpg"), "wb") as f:
        f.write(b"x")
    (item,) = scan_folder(tmp_path / "src").items
    assert os.fsencode(item.relpath) == b"cat/caf\xe9_latin1.jpg"
    with open(item.path, "rb") as f:
        assert f.read() == b"x"


# ---------------------------------------------------------------- given splits, class order
def test_map_split_names_families_and_errors():
    assert map_split_names(["VALID", "Train", "testing"], "src") == {
        "Train": "train", "VALID": "val", "testing": "test"}
    assert map_split_names(["dev", "val", "TRAIN", "fold_3"], "src") == {
        "TRAIN": "train", "dev": "dev", "val": "val", "fold_3": "fold_3"}
    assert order_splits(["fold_3", "test", "eval", "train", "a"]) == [
        "train", "eval", "test", "a", "fold_3"]
    with pytest.raises(SourceError, match=r"src: split name 'my split' is not a valid split"):
        map_split_names(["train", "my split"], "src")
    with pytest.raises(SourceError, match=r"src: \['Val', 'val'\] all name split 'val'"):
        map_split_names(["train", "val", "Val"], "src")


def test_class_order_numbers_by_value_else_text():
    assert class_order(["10", "2", "1", "02"]) == ["1", "02", "2", "10"]  # ties by text
    assert class_order(["10", "2", "x"]) == ["10", "2", "x"]
    assert class_order(["b", "a", "b"]) == ["a", "b"]
    assert numeric_order_note(["1", "2", "10"]) == (
        "class names are all numbers: sorted as numbers (1, 2, 10), not as text (1, 10, 2, "
        "torchvision ImageFolder's order); pass --labels to choose another order")
    assert numeric_order_note(["1", "2", "3"]) is None  # same order either way: nothing to say
    assert numeric_order_note(["a", "b"]) is None


def test_csv_split_column(tmp_path):
    for rel in ("a/1.jpg", "a/2.jpg", "b/3.jpg"):
        _touch(tmp_path, rel)
    listing = tmp_path / "list.csv"
    listing.write_text("path,label,fold\na/1.jpg,a,Train\na/2.jpg,a, validation \n"
                       "b/3.jpg,b,Train\n", encoding="utf-8")
    result = scan_csv(listing, split_column="fold")
    assert result.given_splits == {"Train": "train", "validation": "val"}
    assert [(i.relpath, i.split) for i in result.items] == [
        ("a/1.jpg", "train"), ("a/2.jpg", "val"), ("b/3.jpg", "train")]
    assert result.layout == "csv" and scan_csv(listing).given_splits == {}
    assert {i.split for i in scan_csv(listing).items} == {None}
    with pytest.raises(ConfigError, match=r"no split column 'split'; columns: \['path', 'label', "
                                          r"'fold'\]"):
        scan_csv(listing, split_column="split")
    listing.write_text("path,label,fold\na/1.jpg,a,train\na/2.jpg,a,\n", encoding="utf-8")
    with pytest.raises(SourceError, match=r"rows with an empty path, label or split, 1: 'line 3'"):
        scan_csv(listing, split_column="fold")


def test_match_split_metadata(tmp_path):
    meta = tmp_path / "meta.csv"
    meta.write_text(f"path,split\na/1.jpg,TRAIN\n{CAFE_NFD}/2.jpg,test\nz/9.jpg,bad name\n",
                    encoding="utf-8")
    items = _items("a/1.jpg", f"{CAFE_NFC}/2.jpg", "a/notes.txt")
    with_split, lacking, mapping = match_split_metadata(items, meta, "split")
    assert [(i.relpath, i.split) for i in with_split] == [("a/1.jpg", "train"),
                                                          (f"{CAFE_NFC}/2.jpg", "test")]
    assert lacking == [items[2]] and mapping == {"TRAIN": "train", "test": "test"}
    meta.write_text("path,split\na/1.jpg,train\na/notes.txt,Train\n", encoding="utf-8")
    with pytest.raises(SourceError, match=r"\['Train', 'train'\] all name split 'train'"):
        match_split_metadata(items, meta, "split")
