"""The URL rule: the one place that tells a remote fsspec URL from a local path.

A location is a local path (``/data/flowers``, ``flowers``), a ``file://`` URL of one (as
:meth:`pathlib.Path.as_uri` writes it; local for every format), or a remote fsspec URL
(``scheme://...`` with any other scheme: ``https://``, ``s3://``, ``gs://``, a chained
``simplecache::s3://...``). Every module that branches on "remote or local" asks :func:`is_url`;
every one that needs the protocol asks :func:`url_protocol` (or :func:`split_url`).
"""
from __future__ import annotations

import functools
import os
from pathlib import Path
from urllib.parse import unquote, urlsplit

from shardkit.errors import ConfigError, ManifestError

__all__ = ["is_url", "url_protocol", "split_url", "local_path", "join", "read_location"]


def _text(root: str | os.PathLike) -> str:
    text = os.fspath(root)
    return text if isinstance(text, str) else os.fsdecode(text)


def is_url(root: str | os.PathLike) -> bool:
    """True when ``root`` is a remote fsspec URL (``scheme://...`` with a scheme other than
    ``file``, e.g. ``https://``, ``s3://``); False for a local path or a ``file://`` URL.

    The one test of "local or remote" in shardkit: only ``wds`` tar shards can be read from a
    remote URL; a ``file://`` root is local for every format (see :func:`local_path`).
    """
    scheme, sep, _ = _text(root).partition("://")
    return bool(sep) and bool(scheme) and "/" not in scheme and scheme.lower() != "file"


def url_protocol(url: str | os.PathLike) -> str:
    """The lower-case protocol of a remote URL (:func:`is_url`): ``"s3"`` for
    ``s3://b/k``, the last one of a chain (``"s3"`` for ``simplecache::s3://b/k``); ``""`` for a
    local path or a ``file://`` URL."""
    if not is_url(url):
        return ""
    return _text(url).split("::")[-1].partition("://")[0].lower()


def split_url(url: str) -> tuple[str, str]:
    """``(scheme, rest)`` of a remote URL, split at its first ``://``, so that
    ``f"{scheme}://{rest}"`` is ``url`` again: ``("s3", "b/k")`` for ``s3://b/k``,
    ``("simplecache::s3", "b/k")`` for a chain.

    Raises:
        ConfigError: ``url`` is not a remote URL (:func:`is_url`).
    """
    if not is_url(url):
        raise ConfigError(f"{url!r} is not a remote URL (scheme://...)")
    scheme, _, rest = url.partition("://")
    return scheme, rest


def local_path(root: str | os.PathLike) -> str:
    """``root`` as a local path: a plain path unchanged, a ``file://`` URL decoded.

    ``file:`` URLs are read as :meth:`pathlib.Path.as_uri` writes them: ``file:///abs/path``
    (also ``file://localhost/abs/path``) with percent-encoded characters, so
    ``Path("/tmp/my data").as_uri() == "file:///tmp/my%20data"`` gives ``/tmp/my data``
    (:func:`urllib.parse.unquote`, surrogate-escaped like ``os.fsdecode`` for non-UTF-8 bytes).

    Raises:
        ManifestError: ``root`` is a remote URL (see :func:`is_url`) or a ``file://`` URL with
            a host other than ``localhost`` or without an absolute path.
    """
    text = _text(root)
    if is_url(text):
        raise ManifestError(f"{text} is a remote URL, not a local path")
    if text[:7].lower() != "file://":
        return text
    parts = urlsplit(text)
    if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
        raise ManifestError(f"{text}: expected a local file URL file:///absolute/path (as "
                            "Path.as_uri() writes it)")
    return unquote(parts.path, errors="surrogateescape")


def join(root: str | os.PathLike, rel: str) -> str:
    """Joins a relative (posix) path onto a local folder, a ``file://`` URL (the result is a
    local path, see :func:`local_path`) or a remote URL (the result is a URL)."""
    if is_url(root):
        return os.fspath(root).rstrip("/") + "/" + rel
    return str(Path(local_path(root)) / rel)


def read_location(location: str) -> bytes:
    """The bytes of a local path or of a remote fsspec URL (``https://``, ``s3://``, ...; the
    filesystem's own package must be installed, e.g. s3fs). A remote object is read with one
    GET (``cat_file``; ``fsspec.open`` would first send a HEAD for the size, and s3fs's
    ``cat_file`` does too unless ``max_concurrency=1``: a second round trip per file). Raises
    OSError (FileNotFoundError for a missing object) or the filesystem's own error."""
    if is_url(location):
        import fsspec

        chained = "::" in location  # the options would go to the outer filesystem
        fs, path = fsspec.core.url_to_fs(
            location, **({} if chained else _one_request(url_protocol(location))))
        return fs.cat_file(path)
    with open(location, "rb") as f:
        return f.read()


@functools.lru_cache(maxsize=None)
def _one_request(protocol: str) -> dict:
    """Storage options under which ``cat_file`` of a whole object is one GET: s3fs's
    ``max_concurrency=1`` (when its version has the option), else none."""
    if protocol not in ("s3", "s3a"):
        return {}
    import inspect

    import fsspec

    try:
        init = fsspec.get_filesystem_class(protocol).__init__
    except ImportError:
        return {}  # url_to_fs names the missing package
    return {"max_concurrency": 1} if "max_concurrency" in inspect.signature(init).parameters \
        else {}
