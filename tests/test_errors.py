"""The one exception tree: every exception class of shardkit is defined in shardkit/errors.py."""
from __future__ import annotations

import ast
import builtins
import errno
from pathlib import Path

import shardkit
from shardkit import errors

ROOT = Path(shardkit.__file__).parent
#: Exception classes allowed outside errors.py: the CLI's click exception (one ``Error:`` line)
#: and a private signal that never leaves its module.
ELSEWHERE = {("cli_common.py", "CommandError"), ("images/normalize.py", "_Reject")}


def _exception_names() -> set[str]:
    names = {n for n in dir(builtins) if isinstance(getattr(builtins, n), type)
             and issubclass(getattr(builtins, n), BaseException)}
    return names | set(errors.__all__) | {"ClickException", "UsageError"}


def _exception_classes_outside_errors(root: Path = ROOT) -> set[tuple[str, str]]:
    known, found = _exception_names(), set()
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel == "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                bases = {b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "")
                         for b in node.bases}
                if bases & known:
                    found.add((rel, node.name))
    return found


def test_no_exception_class_is_defined_outside_errors_py():
    assert _exception_classes_outside_errors() == ELSEWHERE


def test_the_scan_finds_exception_classes(tmp_path):
    """The scan above sees classes deriving from shardkit's, builtin and qualified errors."""
    (tmp_path / "errors.py").write_text("class ShardkitError(Exception):\n    pass\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "m.py").write_text(
        "from x import errors\n\n\nclass Stray(errors.ShardCorruptError):\n    pass\n\n\n"
        "class Other(KeyError, dict):\n    pass\n\n\nclass Plain(dict):\n    pass\n")
    assert _exception_classes_outside_errors(tmp_path) == {("sub/m.py", "Stray"),
                                                           ("sub/m.py", "Other")}


def test_moved_classes_keep_their_bases():
    assert issubclass(errors.DiskFullError, OSError)
    assert issubclass(errors.TrainingDivergedError, FloatingPointError)
    for name in ("ResumeMismatchError", "TransformInputError", "CheckpointError"):
        assert issubclass(getattr(errors, name), errors.ConfigError)
        assert issubclass(getattr(errors, name), ValueError)
    assert issubclass(errors.PixelLimitError, errors.DecodeError)
    assert issubclass(errors.DecodeWarningError, errors.DecodeError)
    assert issubclass(errors.EvalCountError, errors.LoaderError)
    for name in errors.__all__:
        assert issubclass(getattr(errors, name), errors.ShardkitError), name
    e = errors.DiskFullError(errno.ENOSPC, "no space left on device while writing /x", "/x")
    assert (str(e), e.errno, e.filename) == ("no space left on device while writing /x",
                                             errno.ENOSPC, "/x")


def test_pixel_limit_message_names_the_default_limit():
    from shardkit.images.sniff import DEFAULT_MAX_PIXELS, check_pixels

    try:
        check_pixels(20000, 10000, 1000)
    except errors.PixelLimitError as e:
        assert (e.width, e.height, e.pixels, e.max_pixels) == (20000, 10000, 200_000_000, 1000)
        assert str(e) == (f"image of 20000x10000 = 200000000 pixels is over the limit "
                          f"max_pixels=1000 (the reader's limit: shardkit's default "
                          f"{DEFAULT_MAX_PIXELS}, or the max_pixels its caller gave; pack "
                          f"--max-pixels when packing)")
    else:
        raise AssertionError("no PixelLimitError")


def test_public_packages_still_export_their_errors():
    import shardkit.bench
    import shardkit.decode
    import shardkit.transforms

    assert shardkit.decode.PixelLimitError is errors.PixelLimitError
    assert shardkit.decode.DecodeWarningError is errors.DecodeWarningError
    assert shardkit.transforms.TransformInputError is errors.TransformInputError
    assert shardkit.bench.BenchError is errors.BenchError
    for module, name in ((shardkit.decode, "PixelLimitError"),
                         (shardkit.decode, "DecodeWarningError"),
                         (shardkit.transforms, "TransformInputError"),
                         (shardkit.bench, "BenchError")):
        assert name in module.__all__
