"""The plumbing every ``shardkit`` command shares: exit codes, the one-line error, the dataset
argument and the progress default.

How a command that cannot run ends: exit code 2 and one ``Error:`` line on stderr.

The exit codes of every command (the convention of ``diff`` and ``grep``; the doctor commands
document their verdicts in :mod:`shardkit.doctor.cli`): 0 fine, 1 a negative verdict (``check``
found a leak, ``verify`` damage), 2 the command could not run. A run that cannot run prints one
line and never a traceback:

- a :class:`~shardkit.errors.ShardkitError` (bad input, named by the library):
  ``Error: <ErrorType>: <message>``, ``<ErrorType>`` its :mod:`shardkit.errors` class;
- an error of the storage a command reads or writes (:func:`is_store_error`: an ``OSError``,
  ``PermissionError`` included, or any error of botocore / aiobotocore / s3fs / gcsfs / adlfs /
  fsspec / aiohttp, such as ``NoCredentialsError``, ``EndpointConnectionError`` or
  ``ClientError``): ``Error: <URL>: <StoreErrorType>: <the store's message>``, where ``<URL>``
  is the command's object-store URL argument (the dataset), or, for a command without one,
  ``Error: <StoreErrorType>: <message>``.

A credentials problem or an unreachable endpoint is therefore exit 2, never 1: a CI gate that
reads 1 as "leak or damage found" is not misled. Messages are made one line (whitespace runs
collapsed) and printable (lone surrogates of file names that are not UTF-8 as ``\\xNN``).

:func:`one_line_errors` applies this to a click command's callback; :class:`shardkit.cli`'s group
applies the same mapping to every command it runs, as a backstop. :func:`run_command` turns a
:class:`~shardkit.errors.ShardkitError` of one call into a :class:`CommandError`.

The flag vocabulary every command shares:

- the dataset is the positional ``DATASET`` argument (:func:`dataset_argument`): a local folder,
  or the URL of a wds dataset in object storage wherever the readers take one (``shardkit pack
  SRC DATASET`` writes it);
- ``--out DIR`` is where a command writes its results (``inspect``'s PNG grids, ``bench``'s
  ``bench.json`` and plots, ``train``'s run folder), never the dataset;
- ``--split NAME`` is a split name (``pack``'s ratios are ``--split-ratios``);
- ``--decoder`` is a choice of :func:`decoder_choice`: ``auto`` or a name of the
  :data:`shardkit.decode.DECODERS` registry;
- a list option takes a comma list and may be repeated (:class:`CommaList`, :func:`joined`);
- an old spelling kept for a release is a second name of the same option, or an option whose
  help starts with :func:`alias_help`'s text; it works as before (never reinterpreted).

Progress bars (tqdm, on stderr) are on by default when stderr is a terminal and off otherwise
(pipes, CI logs; :func:`progress_default`); ``--progress`` / ``--no-progress``
(:data:`PROGRESS_OPTION`) force them.
"""
from __future__ import annotations

import functools
import os
import sys
from collections.abc import Iterable
from pathlib import Path

import click

from shardkit.errors import ShardkitError

__all__ = ["CommandError", "is_store_error", "cannot_run", "one_line_errors", "printable_text",
           "STORE_PACKAGES", "run_command", "progress_default", "dataset_arg", "PROGRESS_OPTION",
           "dataset_argument", "new_dataset_arg", "decoder_choice", "CommaList", "joined",
           "flattened", "alias_help"]

STORE_PACKAGES = ("botocore", "aiobotocore", "boto3", "s3transfer", "s3fs", "gcsfs", "adlfs",
                  "fsspec", "aiohttp", "google.auth", "google.api_core", "google.cloud",
                  "azure", "requests", "urllib3", "httpx")
"""Packages (module prefixes) whose exceptions are errors of a store or of the network."""


def printable_text(text: str) -> str:
    """``text`` that any UTF-8 stream accepts: lone surrogates from a file name that is not
    UTF-8 (``os.fsdecode`` of ``b"caf\\xe9"`` is ``"caf\\udce9"``) as the escape of the original
    byte (``"caf\\\\xe9"``, as the ``class`` field of shardkit's ``.json`` members writes it);
    other lone surrogates as ``\\udXXX``. Valid text is returned as it is."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a surrogate outside U+DC80..U+DCFF: no byte behind it
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


class CommandError(click.ClickException):
    """A command that could not run: exit code 2 and one stderr line ``Error: <message>`` (click
    prints it). Built from a :class:`~shardkit.errors.ShardkitError` (the message is
    ``<ErrorType>: <its message>``) or from any exception with ``where`` (see
    :func:`cannot_run`)."""

    exit_code = 2

    def __init__(self, exc: BaseException, where: str | None = None):
        text = f"{type(exc).__name__}: {exc}"
        if where is not None:
            text = f"{where}: {text}"
        super().__init__(printable_text(" ".join(text.split())))  # one line


def _from_package(module: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in STORE_PACKAGES)


def _raised_in_store(exc: BaseException) -> bool:
    """Whether the innermost frame of ``exc``'s traceback is a store package's code."""
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return _from_package(str(tb.tb_frame.f_globals.get("__name__", "")))


def is_store_error(exc: BaseException) -> bool:
    """Whether ``exc`` is an error of the storage or the network rather than of shardkit's
    input: an ``OSError`` (a local or remote file: missing, no permission, disk full, refused
    connection, timeout), an exception class of one of :data:`STORE_PACKAGES` (botocore's
    ``NoCredentialsError``, ``EndpointConnectionError``, ``ClientError``; aiohttp's errors...),
    or a ``ValueError`` / ``ImportError`` raised by their code (fsspec's "Protocol not known",
    its "Install s3fs to access S3")."""
    if isinstance(exc, OSError):
        return True
    if any(_from_package(cls.__module__) for cls in type(exc).__mro__):
        return True
    return isinstance(exc, (ValueError, ImportError)) and _raised_in_store(exc)


def _first_url(values: Iterable) -> str | None:
    from shardkit.storage.urls import is_url

    for value in values:
        items = value if isinstance(value, (list, tuple)) else (value,)
        for item in items:
            if isinstance(item, (str, os.PathLike)) and is_url(os.fspath(item)):
                return os.fspath(item)
    return None


def cannot_run(exc: BaseException, arguments: Iterable = ()) -> CommandError | None:
    """The :class:`CommandError` for ``exc``, or None when ``exc`` is neither a
    :class:`~shardkit.errors.ShardkitError` nor a store error (:func:`is_store_error`; a bug,
    whose traceback is kept). ``arguments``: the command's argument values; the first URL among
    them names the store in the message."""
    if isinstance(exc, click.ClickException):
        return None  # already a one-line click error
    if isinstance(exc, ShardkitError):
        return CommandError(exc)
    if is_store_error(exc):
        return CommandError(exc, _first_url(arguments))
    return None


def one_line_errors(fn):
    """Decorator of a click command's callback: a :class:`~shardkit.errors.ShardkitError` or a
    store error (:func:`is_store_error`) raised by it ends the command with exit code 2 and one
    ``Error:`` line (:func:`cannot_run`, the URL among its arguments named). Put it under the
    click decorators, on the function."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - mapped, or re-raised as it is
            err = cannot_run(exc, [*args, *kwargs.values()])
            if err is None:
                raise
            raise err from None
    return wrapper


def run_command(fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, with a ShardkitError turned into a
    :class:`~shardkit.cli_common.CommandError` (store errors: see :func:`one_line_errors` on the
    commands)."""
    try:
        return fn(*args, **kwargs)
    except ShardkitError as exc:
        raise CommandError(exc) from None


def progress_default(flag: bool | None) -> bool:
    """``flag`` when given (``--progress`` / ``--no-progress``), else whether stderr is a
    terminal."""
    if flag is not None:
        return flag
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty())


def dataset_arg(ctx, param, value: str):
    """Click callback of a dataset argument (DATASET): the URL of a wds pack in object
    storage as it is, else a local folder that must exist (a ``Path``)."""
    from shardkit.storage.urls import is_url

    if is_url(value):
        return value.rstrip("/")
    return click.Path(exists=True, file_okay=False, path_type=Path).convert(value, param, ctx)


def new_dataset_arg(ctx, param, value: str):
    """Click callback of the dataset a command writes (``shardkit pack SRC DATASET``): a URL as
    it is, else a local ``Path`` (which need not exist yet)."""
    from shardkit.dataset.manifest import is_url

    return value if is_url(value) else Path(value)


def dataset_argument(*, exists: bool = True, nargs: int = 1):
    """The positional ``DATASET`` argument of a command (its parameter is ``dataset``):
    :func:`dataset_arg` when ``exists`` (a dataset the command reads), else
    :func:`new_dataset_arg`. ``nargs=-1``: one or more datasets, given as a tuple (not required
    by click, so that a command can merge an old option spelling into it)."""
    check = dataset_arg if exists else new_dataset_arg
    if nargs == 1:
        return click.argument("dataset", metavar="DATASET", callback=check)

    def each(ctx, param, values):
        return tuple(check(ctx, param, v) for v in values)

    return click.argument("dataset", metavar="DATASET...", nargs=nargs, required=False,
                          callback=each)


def decoder_choice() -> click.Choice:
    """``--decoder``'s type: ``auto`` or a name of :data:`shardkit.decode.DECODERS` (whether
    that decoder runs here is checked when it is opened)."""
    from shardkit.decode import DECODERS

    return click.Choice(["auto", *DECODERS])


class CommaList(click.ParamType):
    """A list option's value: items separated by commas (``roi,pil``), each converted by
    ``item`` (a click type, e.g. a :class:`click.Choice`); gives a tuple. With ``multiple=True``
    the repeated values are flattened by :func:`flattened`, so ``--decoder roi,pil`` and
    ``--decoder roi --decoder pil`` are the same."""

    def __init__(self, item: click.ParamType):
        self.item = item
        self.name = f"list of {item.name}"

    def get_metavar(self, param, *args, **kwargs):
        inner = self.item.get_metavar(param, *args, **kwargs) if isinstance(
            self.item, click.Choice) else None
        return f"{inner or self.item.name.upper()},..."

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        items = [v.strip() for v in str(value).split(",")]
        if any(not v for v in items):
            self.fail(f"{value!r} has an empty item; expected a comma list such as a,b", param,
                      ctx)
        return tuple(self.item.convert(v, param, ctx) for v in items)


def flattened(ctx, param, values) -> tuple:
    """Click callback of a ``multiple=True`` :class:`CommaList` option: the items of every
    occurrence in order, duplicates dropped."""
    return tuple(dict.fromkeys(v for group in values for v in group))


def joined(ctx, param, values) -> str:
    """Click callback of a ``multiple=True`` text list option: the occurrences joined with
    commas (``--cache none --cache ram`` is ``--cache none,ram``), parsed by the command."""
    return ",".join(values)


def alias_help(new: str) -> str:
    """The help of an option kept as the old spelling of ``new``."""
    return f"Alias of {new}, the old spelling (kept for one release)."


PROGRESS_OPTION = click.option("--progress/--no-progress", default=None,
                               help="tqdm bars on stderr [default: on when stderr is a terminal].")
"""The ``--progress/--no-progress`` option (None when not given: see :func:`progress_default`)."""
