"""Remote sources: an object-store prefix read as a folder tree, or a remote ``.csv`` list.

:func:`scan_url` takes an fsspec URL (``s3://bucket/flowers``, ``gs://...``, ``https://...``):

* A URL ending in ``.csv`` (case-insensitive) is a CSV list, parsed exactly as
  :func:`shardkit.sources.csvlist.scan_csv` parses a local one, after one GET of the CSV. A relative
  ``path`` cell resolves against the CSV's own URL folder and becomes a URL (``daisy/a.jpg`` in
  ``s3://b/lists/all.csv`` is ``s3://b/lists/daisy/a.jpg``, relpath ``daisy/a.jpg``; "\\" read
  as "/"; ``..`` leaving the folder keeps the URL as relpath); a URL cell is kept; an absolute
  local path is a local file, as in a local CSV. No object is looked up here: a missing one is
  quarantined by the check with its read error.
* Any other URL is a prefix, read like :func:`shardkit.sources.folder.scan_folder` reads a folder, with
  the same code (:func:`shardkit.sources.folder.scan_tree`): ``<prefix>/<class>/.../<file>``, split-first
  detection and ``layout`` (:mod:`shardkit.sources.layouts`), the ignored names at any depth (dot-files,
  ``__MACOSX``, ``._*``, ``Thumbs.db``...), objects directly under the prefix ignored as "file
  beside the class folders", NFC relpaths, sorted results, the same warnings and errors. Object
  stores have no folders: a folder is a ``/`` in a key. Zero-byte folder marker keys (``daisy/``,
  written by consoles and some sync tools) are listed as ignored; so is an object that has the
  name of a folder of other objects (``daisy`` beside ``daisy/a.jpg``). An empty class folder
  exists only through its marker. Symbolic-link rules are local-only.

Item ``path`` is the object's full URL with its protocol (what
:func:`shardkit.storage.urls.read_location` and ``fsspec.open`` take), ``relpath`` is relative to
the prefix, ``ScanResult.root`` is the URL (without a trailing ``/``), ``kind`` is ``"folder"``
(``"csv"`` for a list).

Cost: the prefix is listed once: one delimited listing of the prefix, then every top folder
(a class, or a split) with ``fs.find(folder, detail=True)``, :data:`LIST_CONCURRENCY` folders
at a time (:func:`_list`). On S3 (s3fs) a ``find`` is one paginated ``ListObjectsV2`` without
delimiter, one LIST request per 1,000 keys one after the other, so 10 M objects in 1,000 class
folders are 10,000 requests in 16 parallel chains instead of one. Every key under the prefix
is listed, also those in ignored folders. The listing is held while the tree is built (measured with s3fs: ~3.7 KB a key,
then ~370 B a key in the tree; s3fs's own listing cache of the prefix is then dropped). Over
``http(s)://``, fsspec's HTTPFileSystem reads the HTML index pages of a file server (``python
-m http.server``, nginx ``autoindex``, Apache ``Indexes``): one GET per folder; links with a
query (``?C=N;O=D`` sort links) are ignored, names are percent-decoded for the relpath; an empty
folder is not seen. A site whose pages are not such listings yields nothing.

Credentials and endpoints are fsspec's: s3fs reads the standard ``AWS_*`` variables
(``AWS_ENDPOINT_URL`` for MinIO or another S3 API), ``~/.aws`` and fsspec's config; shardkit
has none of its own.
"""
from __future__ import annotations

import dataclasses
import io
import logging
import os
import posixpath
import urllib.parse

from shardkit.sources import csvlist
import shardkit.sources.folder as folder_scan
import shardkit.sources.items as source_items
from shardkit.errors import ConfigError, SourceError
from shardkit.sources.items import ScanResult, SourceItem
from shardkit.storage.urls import split_url, url_protocol

__all__ = ["scan_url"]

logger = logging.getLogger("shardkit.scan_remote")

_S3 = "pip install 'shardkit[s3]' (s3fs)"
_INSTALL = {"s3": _S3, "s3a": _S3, "gs": "pip install gcsfs", "gcs": "pip install gcsfs",
            "az": "pip install adlfs", "abfs": "pip install adlfs", "abfss": "pip install adlfs",
            "http": "pip install aiohttp", "https": "pip install aiohttp"}
_MARKER = "folder marker (zero-byte object named like a folder)"


def scan_url(url: str, layout: str = "auto", split_column: str | None = None) -> ScanResult:
    """Scans a remote source: a prefix of objects (a folder tree) or a ``.csv`` list (rules and
    cost in the module docstring).

    Args:
        url: fsspec URL; a trailing ``/`` is dropped.
        layout: ``"auto"``, ``"class"`` or ``"split/class"`` (prefixes only).
        split_column: the given split column of a ``.csv`` list (as
            :func:`shardkit.sources.csvlist.scan_csv`).

    Returns:
        ScanResult, as :func:`shardkit.sources.folder.scan_folder` (prefix) or
        :func:`shardkit.sources.csvlist.scan_csv` (list) return it; ``path`` of every item is a URL.

    Raises:
        ConfigError: ``layout`` is not a layout, or not ``"auto"`` for a ``.csv``; the
            protocol is unknown or its package is not installed (the message names the pip
            command, e.g. ``pip install 'shardkit[s3]'``).
        SourceError: the prefix is empty or missing, names one object, or cannot be listed (no
            such bucket, no credentials, no connection: the cause is named); the CSV cannot be
            read; every error of the folder and CSV rules. Each names the URL.
    """
    folder_scan.check_layout(layout)
    url = os.fspath(url).rstrip("/")
    fs, path = _filesystem(url)
    if url.lower().endswith(".csv"):
        if layout != "auto":
            raise ConfigError(f"--layout {layout} is for folder sources; {url} is a .csv list")
        return _scan_csv_url(fs, path, url, split_column)
    return _scan_prefix(fs, path.rstrip("/"), url, layout)


def _filesystem(url: str):
    """``(fs, path)`` of ``url`` (``fsspec.core.url_to_fs``); ConfigError when the protocol is
    unknown or its package missing."""
    import fsspec

    protocol = url_protocol(url)
    try:
        return fsspec.core.url_to_fs(url)
    except ImportError as e:
        hint = _INSTALL.get(protocol, "install the fsspec implementation of that protocol")
        raise ConfigError(f"source {url!r}: the {protocol}:// filesystem needs a package that "
                          f"is not installed ({e}); {hint}") from e
    except ValueError as e:  # fsspec: "Protocol not known: ..."
        raise ConfigError(f"source {url!r}: {e}; expected an fsspec URL such as "
                          "s3://bucket/prefix, gs://bucket/prefix or https://host/folder") from e


def _cause(e: BaseException) -> str:
    """``Type: message`` of a remote error; fsspec's HTTP raises FileNotFoundError for any
    failure (404, no connection) with the real one as its cause."""
    cause = e.__cause__ or e.__context__
    if isinstance(e, FileNotFoundError) and cause is not None:
        e = cause
    return f"{type(e).__name__}: {e}"


def _scan_prefix(fs, base: str, url: str, layout: str) -> ScanResult:
    where = f"source prefix {url!r}"
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    http = bool({"http", "https"} & set(protocols))
    try:
        listing = fs.find(base, detail=True) if http else _list(fs, base)
    except Exception as e:  # noqa: BLE001 - the filesystem's own errors (botocore, aiohttp...)
        raise SourceError(f"cannot list {where}: {_cause(e)}") from e
    if base in listing and not any(k.startswith(base + "/") for k in listing):
        raise SourceError(f"source {url!r} is one object, not a prefix of class folders "
                          "(<prefix>/<class>/<file>) or a .csv list")
    logger.info("listed %s: %d keys", url, len(listing))
    tree = _RemoteTree(url)
    tree.add(base, listing, http)
    del listing
    _forget_listing(fs, base)
    if not tree.top.children and not tree.top.extra:
        if http:
            _probe(fs, base, where)
        raise SourceError(f"{where} is empty or does not exist (no object under it"
                          + (", or its page is not an index of links" if http else "") + ")")
    return folder_scan.scan_tree(tree, tree.top, layout, where)


LIST_CONCURRENCY = 16
"""Top folders of a prefix listed at once (:func:`_list`)."""


def _list(fs, base: str) -> dict[str, dict]:
    """What ``fs.find(base, detail=True)`` returns (every object under ``base``, by name), with
    the prefix's top folders (the classes, or the splits) listed in parallel: one delimited
    listing of ``base``, then one ``find`` per top folder, :data:`LIST_CONCURRENCY` at a time.
    An object store lists one key range as a chain of 1,000-key pages, so a single ``find`` of
    10 M keys is 10,000 requests one after the other; 1,000 class folders make 1,000 chains.
    A missing prefix gives ``{}`` and a missing bucket raises, as ``find`` does."""
    from concurrent.futures import ThreadPoolExecutor

    try:
        top = fs.ls(base, detail=True)
    except FileNotFoundError:  # an empty prefix ({}), or no such bucket (find says which)
        return fs.find(base, detail=True)
    listing = {e["name"]: e for e in top if e.get("type") != "directory"}
    folders = [e["name"] for e in top if e.get("type") == "directory"]
    with ThreadPoolExecutor(LIST_CONCURRENCY, thread_name_prefix="shardkit-list") as pool:
        for part in pool.map(lambda folder: fs.find(folder, detail=True), folders):
            listing.update(part)
    return listing


def _forget_listing(fs, base: str) -> None:
    """Drops the filesystem's listing cache of the prefix: s3fs keeps every key's details (about
    3.7 KB a key, measured: 37 GB for 10 M keys) for the life of its cached instance, while the
    tree holds what the scan needs (~370 B a key). The cost: a read in this process asks for
    the object's size first (one HEAD, which the cache saved; worker processes and Ray tasks
    never had the cache)."""
    cache = getattr(fs, "dircache", None)
    if cache is not None:
        for key in [k for k in cache if k == base or k.startswith(base + "/")]:
            cache.pop(key, None)


def _probe(fs, base: str, where: str) -> None:
    """After an empty HTTP listing: a SourceError naming the cause when the URL cannot be
    reached (fsspec's HTTP listing returns nothing for a host that refuses); nothing when the
    server answered (a 404 has a ``status``: the prefix does not exist)."""
    try:
        fs.info(base)
    except FileNotFoundError as e:
        cause = e.__cause__ or e.__context__
        if cause is not None and getattr(cause, "status", None) is None:
            raise SourceError(f"cannot list {where}: {_cause(e)}") from e
    except Exception as e:  # noqa: BLE001 - the filesystem's own errors
        raise SourceError(f"cannot list {where}: {_cause(e)}") from e


class _Node:
    """A folder (``children``: name -> node; ``extra``: entries that cannot be children, such
    as folder markers) or an object (``children`` None; ``reason`` set when it is no sample)."""

    __slots__ = ("url", "rel", "children", "extra", "reason")

    def __init__(self, url: str, rel: str, folder: bool, reason: str | None = None):
        self.url, self.rel, self.reason = url, rel, reason
        self.children: dict[str, _Node] | None = {} if folder else None
        self.extra: list[tuple[str, _Node]] | None = [] if folder else None


class _RemoteTree:
    """The listing interface of :func:`shardkit.sources.folder.scan_tree` over a flat listing: an
    in-memory tree of :class:`_Node`, built by :meth:`add`."""

    def __init__(self, root: str):
        self.root = root
        self.top = _Node(root, "", True)

    def add(self, base: str, listing: dict, http: bool) -> None:
        """Adds the keys of ``fs.find(base, detail=True)`` below ``base``."""
        for key, info in sorted(listing.items()):
            if not key.startswith(base + "/"):
                continue  # the prefix's own key (or marker) and nothing else
            raw = key[len(base) + 1:].split("/")
            folder = self.top
            for depth, seg in enumerate(raw[:-1]):
                folder = self._folder(folder, seg, raw[:depth + 1], http)
            if info.get("type") == "directory":  # a store that lists folders as entries
                if raw[-1]:
                    self._folder(folder, raw[-1], raw, http)
            elif raw[-1] == "":
                if len(raw) > 1:  # "daisy/": a marker (the prefix's own is skipped)
                    size = info.get("size")
                    why = _MARKER if not size else "object named like a folder (key ends in /)"
                    folder.extra.append(("", self._node(raw, http, False, why)))
            else:
                query = http and ("?" in raw[-1] or "#" in raw[-1])
                node = self._node(raw, http, False, "link with a query (?...) on an index "
                                  "page, not an object" if query else None)
                name = self._name(raw[-1], http)
                if name in folder.children:  # a folder of that name came first
                    node.reason = _clash(name)
                    folder.extra.append((name, node))
                else:
                    folder.children[name] = node

    def _node(self, raw: list[str], http: bool, folder: bool, reason: str | None = None):
        rel = "/".join(self._name(s, http) for s in raw)
        return _Node(f"{self.root}/{'/'.join(raw)}", rel, folder, reason)

    @staticmethod
    def _name(seg: str, http: bool) -> str:
        return urllib.parse.unquote(seg) if http else seg

    def _folder(self, parent: _Node, seg: str, raw: list[str], http: bool) -> _Node:
        name = self._name(seg, http)
        node = parent.children.get(name)
        if node is not None and node.children is None:  # an object of that name: set aside
            node.reason = _clash(name)
            parent.extra.append((name, node))
            node = None
        if node is None:
            node = parent.children[name] = self._node(raw, http, True)
        return node

    def entries(self, node: _Node) -> list[tuple[str, _Node]]:
        return sorted(list(node.children.items()) + node.extra, key=lambda e: e[0])

    @staticmethod
    def kind(node: _Node) -> str:
        return "dir" if node.children is not None else "other" if node.reason else "file"

    @staticmethod
    def path(node: _Node) -> str:
        return node.url

    ident = path

    @staticmethod
    def raw_rel(node: _Node) -> str:
        return node.rel

    @staticmethod
    def other_reason(node: _Node) -> str:
        return node.reason


def _clash(name: str) -> str:
    return f"object named like a folder of other objects ({name!r} and {name}/...)"


def _scan_csv_url(fs, path: str, url: str, split_column: str | None) -> ScanResult:
    try:
        data = fs.cat_file(path)
    except Exception as e:  # noqa: BLE001 - the filesystem's own errors
        raise SourceError(f"cannot read CSV {url!r}: {_cause(e)}") from e
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise SourceError(f"cannot read CSV {url!r}: not UTF-8 text ({e})") from e
    header, rows = csvlist.parse_csv(io.StringIO(text, newline=""), url)
    base = url.rsplit("/", 1)[0]
    return csvlist.scan_rows(url, header, rows, base, _url_row(base), split_column)


def _url_row(base: str):
    """The row rule of a remote CSV (``base``: its URL folder) for a cell that is not a URL: a
    relative path becomes a URL under ``base``; an absolute local path is a local file."""
    protocol, folder = split_url(base)
    local = csvlist.local_row(base)  # an absolute path ignores base (and is its own relpath)

    def locate(raw: str, item: SourceItem, out: ScanResult) -> bool:
        if os.path.isabs(raw):
            return local(raw, item, out)
        if raw.endswith(("/", "\\")):
            return False  # names a folder
        joined = posixpath.normpath(posixpath.join(folder, raw.replace("\\", "/")))
        location = f"{protocol}://{joined}"
        inside = joined.startswith(folder + "/")
        rel = source_items.nfc(joined[len(folder) + 1:]) if inside else location
        out.items.append(dataclasses.replace(item, path=location, relpath=rel))
        return True
    return locate
