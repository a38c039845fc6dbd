"""The one exception tree of shardkit.

Every error a user can trigger with bad input derives from :class:`ShardkitError`; messages name
the bad value (file, key, shard, option) and what was expected. Every exception class of shardkit
is defined here (the CLI's ``click`` exception aside: ``shardkit.cli_common.CommandError``)::

    ShardkitError
    +-- ConfigError (also a ValueError)
    |   +-- CheckpointError
    |   +-- ResumeMismatchError
    |   +-- TransformInputError
    +-- SourceError
    +-- LabelError
    |   +-- UnknownLabelError
    +-- SplitError
    +-- OutputExistsError
    +-- OutputLockedError
    +-- DiskFullError (also an OSError)
    +-- UploadError
    +-- PackInvariantError
    +-- ManifestError
    +-- ShardCorruptError
    +-- ShardFetchError
    +-- ResourceLimitError
    +-- DecodeError
    |   +-- PixelLimitError
    |   +-- DecodeWarningError
    +-- LoaderError
    |   +-- EvalCountError
    +-- ArenaUnavailable
    +-- TrainingDivergedError (also a FloatingPointError)
    +-- BenchError
    +-- PackFailed
"""
from __future__ import annotations

__all__ = [
    "ShardkitError", "ConfigError", "SourceError", "LabelError", "UnknownLabelError",
    "SplitError", "OutputExistsError", "ManifestError", "ShardCorruptError", "ShardFetchError",
    "DecodeError", "LoaderError", "SharedMemoryError", "CheckpointError", "ResourceLimitError",
    "ResumeMismatchError",
    "TransformInputError", "OutputLockedError", "DiskFullError", "UploadError",
    "PackInvariantError", "PixelLimitError", "DecodeWarningError", "EvalCountError",
    "ArenaUnavailable", "TrainingDivergedError", "BenchError", "PackFailed",
]


class ShardkitError(Exception):
    """Base class of every error shardkit raises on purpose."""


class ConfigError(ShardkitError, ValueError):
    """An option or config value is invalid (the message names it and the allowed values)."""


class SourceError(ShardkitError):
    """The pack source (folder or CSV) cannot be used as given."""


class LabelError(ShardkitError):
    """Labels are inconsistent: a label map is malformed, or identical bytes carry two labels."""


class UnknownLabelError(LabelError):
    """Folder or CSV labels match no known class; lists the unknown names and the closest ones."""

    def __init__(self, unknown: dict[str, list[str]], known: list[str]):
        self.unknown = unknown
        self.known = known
        parts = [f"{name!r} (closest: {', '.join(repr(c) for c in close) or 'none'})"
                 for name, close in unknown.items()]
        super().__init__(f"{len(unknown)} label(s) match no class of the label map: "
                         + "; ".join(parts) + f". Known classes: {known}")


class SplitError(ShardkitError):
    """A split specification is invalid or cannot be met."""


class OutputExistsError(ShardkitError):
    """The output folder already holds a dataset; pass --overwrite to replace it."""


class OutputLockedError(ShardkitError):
    """Another shardkit command holds the lock of the dataset folder (names the command, its
    pid, host and start time)."""


class DiskFullError(ShardkitError, OSError):
    """No space left on the device (or quota) while writing a pack; ``filename`` is the file that
    was being written, ``errno`` is ``ENOSPC`` or ``EDQUOT``. The files of the run were removed."""

    def __str__(self) -> str:
        return str(self.strerror)


class UploadError(ShardkitError):
    """An upload into the remote ``OUT`` failed, or the object's size is not the local file's."""


class PackInvariantError(ShardkitError):
    """The packer's own bookkeeping does not add up (scanned != packed + quarantined); a bug."""


class ManifestError(ShardkitError):
    """manifest.json or a split index is missing, unreadable or of an unknown schema version."""


class ShardCorruptError(ShardkitError):
    """A shard's bytes do not match the manifest (hash, size, count) or a sample cannot be read.

    Attributes:
        shard: the shard it is about (its path in the dataset, as the manifest lists it), or
            None. key: the sample it is about, or None (the whole shard, or not known). Set
            where the error is raised; the message names them too. The read path decides from
            them whether an error already names its sample (:mod:`shardkit.stream.stages`).
    """

    def __init__(self, *args, shard: str | None = None, key: str | None = None):
        super().__init__(*args)
        self.shard = shard
        self.key = key


class ShardFetchError(ShardkitError):
    """A remote shard could not be fetched (HTTP 404 or 500, a refused connection, a timeout),
    after the prefetcher's retries (:mod:`shardkit.stream.prefetch`). Never a sample's fault:
    ``on_error="skip"`` never skips it, so an epoch never ends short for it.

    Attributes:
        shard: the shard's path in the dataset (as the manifest lists it). url: the URL fetched.
    """

    def __init__(self, message: str, shard: str | None = None, url: str | None = None):
        super().__init__(message)
        self.shard = shard
        self.url = url


class ResourceLimitError(ShardkitError):
    """The operating system refused a resource a reader needs: open files (EMFILE, ENFILE),
    memory or address space (ENOMEM), or a temporarily exhausted one (EAGAIN, ENOBUFS).

    Not data damage: no byte of the dataset was found wrong, so it is never a
    :class:`ShardCorruptError` and ``on_error="skip"`` never skips it. The message names the
    file, the limit (with its current value where the OS reports one) and how to raise it.

    Attributes:
        errno: the OS error number (``errno.EMFILE`` ...). path: the file being opened or read.
    """

    def __init__(self, message: str, errno: int | None = None, path: str | None = None):
        super().__init__(message)
        self.errno = errno
        self.path = path


class DecodeError(ShardkitError):
    """An image could not be decoded; names the shard and key when known.

    Attributes:
        shard, key: the shard and the sample it is about when known, else None (as
            :class:`ShardCorruptError`).
    """

    def __init__(self, *args, shard: str | None = None, key: str | None = None):
        super().__init__(*args)
        self.shard = shard
        self.key = key


class PixelLimitError(DecodeError):
    """An image's header size is over the pixel limit. Attributes: ``width``, ``height``,
    ``pixels`` (= width * height) and ``max_pixels``. ``default_max_pixels``: the readers'
    default limit, named in the message (:data:`shardkit.images.sniff.DEFAULT_MAX_PIXELS`, which
    :func:`shardkit.images.sniff.check_pixels` passes)."""

    def __init__(self, width: int, height: int, max_pixels: int,
                 default_max_pixels: int | None = None):
        self.width, self.height, self.max_pixels = width, height, max_pixels
        self.pixels = width * height
        default = "" if default_max_pixels is None else \
            f"shardkit's default {default_max_pixels}, or "
        super().__init__(f"image of {width}x{height} = {self.pixels} pixels is over the limit "
                         f"max_pixels={max_pixels} (the reader's limit: {default}the max_pixels "
                         f"its caller gave; pack --max-pixels when packing)")


class DecodeWarningError(DecodeError):
    """A decode produced libjpeg warnings and the warning policy is ``"raise"``."""


class LoaderError(ShardkitError):
    """A loader option combination is invalid (for example resampling on a val/test split)."""


class SharedMemoryError(LoaderError):
    """A DataLoader worker process could not get the shared memory (``/dev/shm``) that passes
    a batch to the consuming process. Raised in the worker around the call that allocates it
    (its message: torch's error), and again in the consumer, where the message names the
    loader, the free room of ``/dev/shm`` and what to change."""


class EvalCountError(LoaderError):
    """A merged evaluation did not see every sample of the split exactly once."""


class ArenaUnavailable(ShardkitError):
    """The arena cannot be created or attached (no space, in use with another identity, a file
    of another user, a symbolic link)."""


class TrainingDivergedError(ShardkitError, FloatingPointError):
    """The training loss became NaN or infinite (names the step and the learning rate)."""


class BenchError(ShardkitError):
    """A benchmark run could not produce a measurement (too few batches, a failing loader)."""


class PackFailed(ShardkitError):
    """``shardkit pack`` exited non-zero while preparing benchmark data (stderr in the message)."""


class CheckpointError(ConfigError):
    """A checkpoint or weights file (``--resume``, ``--pretrained``) is missing, unreadable, not
    of the expected kind, or holds more than plain tensors and containers (a pickle that would
    run code on load is refused, never executed); the message names the file."""


class ResumeMismatchError(ConfigError):
    """``--resume`` was given a config whose schedule-defining fields differ from the checkpoint."""


class TransformInputError(ConfigError):
    """An argument handed to a transform (output buffer, batch tensor) has the wrong shape/dtype."""


#: Errors a bad sample may raise while it is read or decoded: what ``on_error`` handles in the
#: loader (:func:`shardkit.stream.make_loader`) and the Ray read tasks (a DecodeWarningError is
#: ``on_warning``'s, never these; a programming error such as a TypeError is not among them).
#: Not in ``__all__``, which lists the exception classes.
SAMPLE_ERRORS = (ShardkitError, OSError, ValueError, RuntimeError)
