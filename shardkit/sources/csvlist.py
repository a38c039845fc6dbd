"""CSV sources: the CSV list (:func:`scan_csv`) and metadata CSV joins (group and split columns).

Re-exported by :mod:`shardkit.sources.folder` (``from shardkit.sources.folder import scan_csv`` keeps working); the
rules for names (NFC, stripping) and the error formats are those of :mod:`shardkit.sources.folder`.

Metadata joins (``--metadata M.csv`` with ``--group-column`` / ``--split-column``) look a row's
path up as the file's relpath under the source root after :func:`_path_key`: "\\" read as "/",
NFC, empty and "." segments dropped (``./daisy//x.jpg`` is ``daisy/x.jpg``), and an absolute
path under the root made relative to it (as written by ``find "$PWD/SRC"``, also when ``$PWD``
reaches the root through a symlink), and so is a full URL under an object-store prefix root
(``s3://bucket/flowers/daisy/a.jpg`` is ``daisy/a.jpg`` of SRC ``s3://bucket/flowers``). Rows
that still match no file are shown next to a file without a row in
:func:`lacking_metadata_error`.
"""
from __future__ import annotations

import csv
import dataclasses
import io
import os
import posixpath
import unicodedata
from pathlib import Path, PurePosixPath

from shardkit.sources import layouts as layout_mod
from shardkit.errors import ConfigError, SourceError
from shardkit.storage.urls import is_url
from shardkit.sources.items import (
    ScanResult, SourceItem, check_unique, path_kind, listing, nfc, unreachable_reason)

__all__ = ["scan_csv", "local_row", "match_group_metadata", "match_split_metadata", "lacking_metadata_error",
           "csv_location"]


def csv_location(csv_path: str | os.PathLike) -> str:
    """How a CSV file is named in messages and in the manifest: a URL (``s3://b/m.csv``) as it
    is, a local path made absolute."""
    csv_s = os.fspath(csv_path)
    return csv_s if is_url(csv_s) else os.path.abspath(csv_s)


def _read_csv(csv_path: str) -> tuple[list[str], list[dict[str, str]]]:
    """``(header, rows)`` of a local CSV file, or of an object-store URL (one GET)."""
    try:
        if is_url(csv_path):
            from shardkit.storage.urls import read_location

            text = read_location(csv_path).decode("utf-8-sig")
            return parse_csv(io.StringIO(text, newline=""), csv_path)
        with open(csv_path, newline="", encoding="utf-8-sig") as f:
            return parse_csv(f, csv_path)
    except (OSError, UnicodeDecodeError) as e:
        raise SourceError(f"cannot read CSV {csv_path!r}: {e}") from e


def parse_csv(f, name: str) -> tuple[list[str], list[dict[str, str]]]:
    """``(header, rows)`` of the CSV text file ``f`` (opened with ``newline=""``): header cells
    and row keys stripped, empty cells as ``""``. SourceError naming ``name`` on a CSV error."""
    try:
        reader = csv.DictReader(f)
        rows = list(reader)
        header = [h.strip() for h in (reader.fieldnames or [])]
    except csv.Error as e:
        raise SourceError(f"cannot read CSV {name!r}: {e}") from e
    rows = [{(k or "").strip(): (v or "") for k, v in r.items()} for r in rows]
    return header, rows


def _disk_path(base: str, raw: str) -> str:
    """Join; if absent as written, try Windows separators as "/" and the NFC/NFD spellings."""
    joined = os.path.abspath(os.path.join(base, raw))
    primary = joined
    if "\\" in raw and os.sep == "/":
        primary = os.path.abspath(os.path.join(base, raw.replace("\\", "/")))
    candidates = [joined, primary] + [unicodedata.normalize(form, p) for p in (joined, primary)
                                      for form in ("NFC", "NFD")]
    return next((p for p in candidates if os.path.lexists(p)), primary)


def _rel(base: str, path: str) -> str:
    rel = os.path.relpath(path, base)
    if rel == ".." or rel.startswith(".." + os.sep):
        rel = path  # outside the root: keep the absolute path
    return nfc(PurePosixPath(*Path(rel).parts).as_posix())


def scan_csv(csv_path: str | os.PathLike, root: str | os.PathLike | None = None,
             split_column: str | None = None) -> ScanResult:
    """Read a CSV list with a header and columns ``path,label[,group]`` (extra columns ignored).

    Relative paths resolve against ``root``, or the CSV's folder when ``root`` is None; absolute
    paths are used as they are; a remote fsspec URL (``https://``, ``s3://``, ``gs://``) is kept
    as the item's path and relpath, and not looked up here (one request per file would double
    the cost of a large remote list): a missing object is quarantined by the check with its
    read error. A path absent as written is also tried with Windows "\\"
    separators read as "/" and in its NFC and NFD spellings. A row whose file does not exist is
    not dropped: it goes to ``ScanResult.missing`` (the packer quarantines it with "file not
    found", or the reason of :func:`shardkit.sources.items.unreachable_reason` for a symlink loop). An
    empty ``group`` cell gives ``group=None``. With ``split_column``, each row's value there is
    its given split (mapped by :func:`shardkit.sources.layouts.map_split_names`; the mapping is
    ``given_splits``).

    Raises:
        ConfigError: ``split_column`` is not a column (the message lists the columns).
        SourceError: the CSV cannot be read, lacks a ``path`` or ``label`` column, has no rows,
            has rows with an empty path, label or split, lists one file twice, lists a folder,
            or a split value is not a valid split name.
    """
    csv_s = csv_location(csv_path)
    base = os.path.abspath(os.fspath(root)) if root is not None else os.path.dirname(csv_s)
    header, rows = _read_csv(csv_s)
    return scan_rows(csv_s, header, rows, base, local_row(base), split_column)


def local_row(base: str):
    """The row rule of :func:`scan_csv` for a path that is not a URL: ``locate(raw, item)`` adds
    ``item`` (path and relpath from ``raw``) to the scan; returns False for a folder."""
    def locate(raw: str, item: SourceItem, out: ScanResult) -> bool:
        path = _disk_path(base, raw)
        item = dataclasses.replace(item, path=path, relpath=_rel(base, path))
        kind = path_kind(path)
        if kind == "dir":
            return False
        if kind in ("broken", "unreachable"):
            out.missing.append(item)
            if kind == "unreachable":  # a symlink loop, say: quarantined with that reason
                out.missing_reasons[item.relpath] = unreachable_reason(path)
        elif kind == "other":
            out.ignored.append((item.relpath, "not a regular file (device, socket or pipe)"))
        else:
            out.items.append(item)
        return True
    return locate


def scan_rows(csv_s: str, header: list[str], rows: list[dict[str, str]], base: str, locate,
              split_column: str | None) -> ScanResult:
    """The rules of :func:`scan_csv` over parsed rows (:func:`parse_csv`) of the CSV named
    ``csv_s`` (a path or URL), ``base`` its root; ``locate(raw, item, out)`` resolves a path
    cell that is not a URL (:func:`local_row`; :mod:`shardkit.sources.remote` has the remote
    one) and returns False when it names a folder. Errors: as :func:`scan_csv`."""
    lacking = [c for c in ("path", "label") if c not in header]
    if lacking:
        raise SourceError(f"CSV {csv_s!r} lacks column(s) {lacking}: a header with path,label"
                          f"[,group] is required; found columns {header}")
    if split_column is not None and split_column not in header:
        raise ConfigError(f"CSV {csv_s!r} has no split column {split_column!r}; columns: "
                          f"{header}")
    if not rows:
        raise SourceError(f"CSV {csv_s!r} has a header but no rows")
    out = ScanResult(items=[], root=base, kind="csv", layout="csv")
    empty, folders = [], []
    mapping = {}
    if split_column is not None:
        mapping = layout_mod.map_split_names(
            sorted({nfc(r[split_column]).strip() for r in rows} - {""}),
            f"CSV {csv_s!r} column {split_column!r}")
    for n, row in enumerate(rows, start=2):
        raw, label = row["path"].strip(), nfc(row["label"]).strip()
        split = mapping.get(nfc(row[split_column]).strip()) if split_column else None
        if not raw or not label or (split_column and not split):
            empty.append(f"line {n}")
            continue
        group = nfc(row.get("group", "")).strip() or None
        item = SourceItem(raw, raw, label, group, split)
        if is_url(raw):  # an object in remote storage: read (and found missing) at the check
            out.items.append(item)
        elif not locate(raw, item, out):
            folders.append(raw)
    if empty:
        what = "path, label or split" if split_column else "path or label"
        raise SourceError(f"CSV {csv_s!r}: rows with an empty {what}, {listing(empty)}")
    out.given_splits = mapping
    if folders:
        raise SourceError(f"CSV {csv_s!r}: paths that are folders, not files, {listing(folders)}")
    out.items.sort(key=lambda i: i.relpath)
    out.missing.sort(key=lambda i: i.relpath)
    check_unique(out.items + out.missing, f"CSV {csv_s!r}")
    return out


def match_group_metadata(items: list[SourceItem], csv_path: str | os.PathLike, column: str,
                         path_column: str = "path", *, root: str | os.PathLike | None = None
                         ) -> tuple[list[SourceItem], list[SourceItem]]:
    """Sets each item's group from ``column`` of a metadata CSV, joined on the NFC relpath.

    The CSV's ``path_column`` holds paths relative to the source root (posix or Windows
    separators, any Unicode form, a leading ``./`` allowed) or absolute paths under it
    (:func:`_path_key`; ``root``, else the root the items' paths share). Rows for files that are
    not items are fine.

    Returns:
        ``(grouped, lacking)``: new items (input order) with ``group`` set, and the items
        without a row or with an empty group value (not an error here: the packer raises
        :func:`lacking_metadata_error` for the images among them).

    Raises:
        ConfigError: ``column`` or ``path_column`` is not a column (message lists the columns).
        SourceError: the CSV cannot be read; one path has two different groups.
    """
    groups = _metadata_values(csv_path, column, path_column, _root_of(items, root))
    out, lacking = [], []
    for item in items:
        value = groups.get(item.relpath)
        if not value:
            lacking.append(item)
            continue
        out.append(dataclasses.replace(item, group=value))
    return out, lacking


def _canonical(raw: str) -> str:
    """``raw`` stripped, "\\" as "/", NFC, without empty or "." segments (a leading "/" kept):
    ``" ./daisy//./x.jpg"`` -> ``"daisy/x.jpg"``. ".." is kept (it may cross a symlink)."""
    key = nfc(raw.strip().replace("\\", "/"))
    parts = [p for p in key.split("/") if p not in ("", ".")]
    return ("/" if key.startswith("/") else "") + "/".join(parts)


def _strip_root(path: str, roots: list[str]) -> str | None:
    """``path`` relative to the first of ``roots`` (canonical, absolute) it lies under, or None."""
    for r in roots:
        head = r.rstrip("/") + "/"
        if path.startswith(head):
            return path[len(head):]
    return None


def _path_key(root: str | None):
    """A function: a metadata CSV's path cell -> the key an item's relpath is looked up by.

    The key is :func:`_canonical`; an absolute path under ``root`` (as spelled, or once the
    folders of both are resolved through symlinks; the file itself is not resolved, so a
    symlinked file keeps its own relpath) becomes relative to it, and so does a URL under a URL
    ``root`` (an object-store prefix). Other paths stay as they are (a CSV source's files
    outside its root have absolute relpaths; a URL stays as written, a URL row's relpath).
    """
    roots = [] if root is None else list(dict.fromkeys(
        _canonical(r) for r in ((root,) if is_url(root) else (root, os.path.realpath(root)))))
    real: dict[str, str] = {}  # folder -> canonical realpath, one lookup per folder

    def key(raw: str) -> str:
        k = _canonical(raw)
        url = is_url(raw.strip())
        if not roots or not (k.startswith("/") or url):
            return raw.strip() if url else k
        rel = _strip_root(k, roots)
        if url:  # under a prefix root: its relpath; else the URL as written (a CSV's URL row)
            return raw.strip() if rel is None else rel
        if rel is None:
            folder, name = posixpath.split(k)
            if folder not in real:
                real[folder] = _canonical(os.path.realpath(folder))
            rel = _strip_root(real[folder] + "/", roots)
            rel = None if rel is None else posixpath.join(rel, name)
        return k if rel is None else rel
    return key


def _root_of(items: list[SourceItem], root: str | os.PathLike | None) -> str | None:
    """``root`` as an absolute path (a URL as it is), else the source root the items' paths and
    relpaths imply (the first item with a relative relpath and an absolute path or a URL), else
    None."""
    if root is not None:
        return os.fspath(root) if is_url(root) else os.path.abspath(os.fspath(root))
    for it in items:
        depth = len(PurePosixPath(it.relpath).parts)
        if it.relpath.startswith("/") or is_url(it.relpath) or not depth:
            continue
        if is_url(it.path):  # an object of a prefix: the URL less the relpath's segments
            return it.path.rsplit("/", depth)[0]
        if os.path.isabs(it.path):
            found = it.path
            for _ in range(depth):
                found = os.path.dirname(found)
            return found
    return None


def _metadata_values(csv_path: str | os.PathLike, column: str, path_column: str,
                     root: str | None = None) -> dict[str, str]:
    """Relpath key (:func:`_path_key` of ``root``) -> NFC stripped value of ``column`` in a
    metadata CSV (errors as :func:`match_group_metadata`)."""
    csv_s = csv_location(csv_path)
    header, rows = _read_csv(csv_s)
    for col in (path_column, column):
        if col not in header:
            raise ConfigError(f"metadata CSV {csv_s!r} has no column {col!r}; columns: {header}")
    values: dict[str, str] = {}
    conflicts = []
    path_key = _path_key(root)
    for row in rows:
        key = path_key(row[path_column])
        value = nfc(row[column]).strip()
        if key in values and values[key] != value:
            conflicts.append(key)
        values[key] = value
    if conflicts:
        raise SourceError(f"metadata CSV {csv_s!r} gives several {column!r} values to "
                          f"{listing(sorted(set(conflicts)))} path(s)")
    return values


def match_split_metadata(items: list[SourceItem], csv_path: str | os.PathLike, column: str,
                         path_column: str = "path", *, root: str | os.PathLike | None = None
                         ) -> tuple[list[SourceItem], list[SourceItem], dict[str, str]]:
    """Sets each item's given ``split`` from ``column`` of a metadata CSV, joined on the
    relpath like :func:`match_group_metadata`; values are mapped to split names by
    :func:`shardkit.sources.layouts.map_split_names` (values of rows that match no item are not read).

    Returns:
        ``(items with split, items without a row or with an empty value, {value: split})``.

    Raises:
        ConfigError: ``column`` or ``path_column`` is not a column. SourceError: the CSV cannot
            be read; one path has two different values; a value is not a valid split name.
    """
    values = _metadata_values(csv_path, column, path_column, _root_of(items, root))
    used = sorted({values[it.relpath] for it in items if values.get(it.relpath)})
    mapping = layout_mod.map_split_names(
        used, f"metadata CSV {csv_location(csv_path)!r} column {column!r}")
    out, lacking = [], []
    for item in items:
        value = values.get(item.relpath)
        if value:
            out.append(dataclasses.replace(item, split=mapping[value]))
        else:
            lacking.append(item)
    return out, lacking, mapping


def lacking_metadata_error(csv_path: str | os.PathLike, column: str, relpaths: list[str], *,
                           root: str | os.PathLike | None = None,
                           known: list[str] | None = None,
                           path_column: str = "path") -> SourceError:
    """The error for ``relpaths`` without a metadata row or ``column`` value: the count, the
    hint below when there is one, then the files (first 20 listed).

    When the CSV has a row that matches no file, one such path is shown next to one of
    ``relpaths`` so the user sees how they differ: a row with the same file name as a file
    without a row (else the same stem, case-insensitive), else, when ``known`` (every item's
    relpath) says which rows match no file, the first such row. ``root`` (the source folder)
    is named in that sentence and used to read absolute CSV paths as :func:`_path_key` does.
    Never raises: an unreadable CSV just gives no example.
    """
    csv_s = csv_location(csv_path)
    text = (f"metadata CSV {csv_s!r} has no row or an empty {column!r} for {len(relpaths)} "
            "file(s)")
    pair = _unmatched_example(csv_s, path_column, relpaths, root, known)
    if pair is not None:  # the hint first: the listing below can be long
        where = os.fspath(root) if root is not None else "SRC"
        text += (f". The CSV's path {pair[0]!r} matches no file; compare the file {pair[1]!r} "
                 f"under {where}: paths must be relative to SRC like that, may start with "
                 "'./', or be absolute under SRC")
    return SourceError(f"{text}. Files without a row: {listing(relpaths)}")


def _unmatched_example(csv_s: str, path_column: str, relpaths: list[str], root, known
                       ) -> tuple[str, str] | None:
    """``(CSV path as written, relpath)`` for :func:`lacking_metadata_error`, or None."""
    try:
        header, rows = _read_csv(csv_s)
    except SourceError:
        return None
    if path_column not in header or not relpaths:
        return None
    path_key = _path_key(_root_of([], root))
    taken = set(relpaths) | set(known or ())
    free = [(raw.strip(), key) for raw, key in ((r[path_column], path_key(r[path_column]))
                                                for r in rows) if key and key not in taken]
    for name_of in (posixpath.basename, lambda p: posixpath.splitext(posixpath.basename(p))[0]
                    .casefold()):
        by_name: dict[str, str] = {}
        for raw, key in free:
            by_name.setdefault(name_of(key), raw)
        for rel in relpaths:
            if name_of(rel) in by_name:
                return by_name[name_of(rel)], rel
    if known is not None and free:
        return free[0][0], relpaths[0]
    return None
