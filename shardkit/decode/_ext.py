"""Build prerequisites and load state of the optional C extension ``shardkit.decode._jpegroi``.

Standard library only: ``setup.py`` loads this file by path (shardkit is not importable while it
is being built) to decide whether the extension is required, ``make install`` calls
:func:`main` with ``--require`` after installing, and the tests use it to skip the headline-path
tests only where the extension cannot be built at all.

Command line: ``python -c "import sys; from shardkit.decode._ext import main; sys.exit(main())"
[--require]`` prints one status line; with ``--require`` it exits 1 (with the reason) when the
libjpeg headers are installed but ``_jpegroi`` does not import, i.e. the install silently lost
the fast path.
"""
from __future__ import annotations

import importlib
import os
import shutil
import sys
import sysconfig

__all__ = ["jpeg_header", "compiler", "python_header", "build_prerequisites", "load",
           "status_line", "main"]

_loaded: tuple | None = None


def _include_dirs() -> list[str]:
    """Directories a default C compile searches for ``<jpeglib.h>``: ``CPATH`` /
    ``C_INCLUDE_PATH`` entries, /usr/local/include, the Debian multiarch dir, /usr/include."""
    dirs = [d for var in ("CPATH", "C_INCLUDE_PATH")
            for d in os.environ.get(var, "").split(os.pathsep) if d]
    dirs.append("/usr/local/include")
    multiarch = sysconfig.get_config_var("MULTIARCH")
    if multiarch:
        dirs.append(f"/usr/include/{multiarch}")
    dirs.append("/usr/include")
    return list(dict.fromkeys(dirs))


def jpeg_header() -> str | None:
    """Path of the first ``jpeglib.h`` in the compiler's default include dirs, or None."""
    for d in _include_dirs():
        path = os.path.join(d, "jpeglib.h")
        if os.path.isfile(path):
            return path
    return None


def compiler() -> str | None:
    """Path of the C compiler setuptools would use (``$CC``, else Python's configured ``CC``,
    else ``cc``), or None when it is not on PATH."""
    cmd = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()
    return shutil.which(cmd[0]) if cmd else None


def python_header() -> str | None:
    """Path of this interpreter's ``Python.h``, or None (Debian: python3-dev missing)."""
    path = os.path.join(sysconfig.get_paths()["include"], "Python.h")
    return path if os.path.isfile(path) else None


def build_prerequisites() -> dict:
    """What building ``_jpegroi`` needs and what was found.

    Returns ``{"compiler": path|None, "jpeglib_h": path|None, "python_h": path|None,
    "missing": [str], "can_build": bool}``; ``missing`` names each absent piece with the
    Debian package that provides it.
    """
    found = {"compiler": compiler(), "jpeglib_h": jpeg_header(), "python_h": python_header()}
    hints = {"compiler": "a C compiler (gcc; Debian: build-essential)",
             "jpeglib_h": "the libjpeg-turbo headers (jpeglib.h; Debian: libjpeg62-turbo-dev, "
                          "Ubuntu: libjpeg-turbo8-dev; `make sysdeps`)",
             "python_h": "Python's headers (Python.h; Debian: python3-dev)"}
    missing = [hints[k] for k, v in found.items() if v is None]
    return {**found, "missing": missing, "can_build": not missing}


def load() -> tuple:
    """Import ``shardkit.decode._jpegroi`` once per process.

    Returns ``(module, None)``, or ``(None, reason)`` with a one-line reason such as
    ``"_jpegroi not built: No module named 'shardkit.decode._jpegroi' (missing: ...)"``.
    """
    global _loaded
    if _loaded is None:
        try:
            _loaded = (importlib.import_module("shardkit.decode._jpegroi"), None)
        except ImportError as exc:
            pre = build_prerequisites()
            why = ("missing: " + "; ".join(pre["missing"]) if pre["missing"] else
                   "the build prerequisites are present: reinstall with `pip install -e . -v` "
                   "and read the compiler output")
            _loaded = (None, f"_jpegroi not built: {exc} ({why})")
    return _loaded


def status_line() -> str:
    """One line: whether ``_jpegroi`` imports, its SIMD level, and the build prerequisites."""
    mod, reason = load()
    if mod is not None:
        level, best = mod.simd_level()
        names = {mod.SIMD_SCALAR: "scalar", mod.SIMD_SSE41: "sse4.1", mod.SIMD_AVX2: "avx2"}
        return (f"shardkit.decode._jpegroi: built ({mod.__file__}); resize SIMD "
                f"{names.get(level, level)} (best here {names.get(best, best)})")
    return f"shardkit.decode._jpegroi: NOT available: {reason}"


def main(argv: list[str] | None = None) -> int:
    """CLI (see the module docstring). Returns the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    if any(a not in ("--require",) for a in argv):
        print(f"usage: shardkit.decode._ext.main([--require]); got {argv}", file=sys.stderr)
        return 2
    mod, reason = load()
    if mod is None and "--require" in argv and jpeg_header():
        print(f"error: the libjpeg headers are installed ({jpeg_header()}) but the C extension "
              f"shardkit.decode._jpegroi did not build or does not import, so the ROI decoder "
              f"and the fused transform would be silently missing. {reason}", file=sys.stderr)
        return 1
    print(status_line())
    return 0
