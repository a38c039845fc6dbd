"""Build prerequisites and load state of shardkit's C extensions.

- ``shardkit.decode._jpegroi``: the ROI decoder and fused transform; needs a C compiler,
  ``Python.h`` and libjpeg-turbo's (>= 1.5) ``jpeglib.h``. Headers of another libjpeg (IJG's,
  without ``LIBJPEG_TURBO_VERSION``) make it unbuildable: the source stops with ``#error``, so
  ``setup.py`` leaves it out and prints why, and the install still succeeds.
- ``shardkit.augment._kernels``: the CPU augmentation kernels; needs a C compiler and
  ``Python.h`` only.

Standard library only: ``setup.py`` loads this file by path (shardkit is not importable while it
is being built) to decide which extensions are required, ``make install`` calls :func:`main`
with ``--require`` after installing, and the tests use it to skip the headline-path tests only
where an extension cannot be built at all.

Command line: ``python -c "import sys; from shardkit.decode.extensions import main; sys.exit(main())"
[--require]`` prints one status line per extension; with ``--require`` it exits 1 (with the
reason) when an extension that can be built here does not import, i.e. the install silently
lost a fast path.
"""
from __future__ import annotations

import importlib
import os
import re
import shutil
import sys
import sysconfig

__all__ = ["jpeg_header", "libjpeg_turbo_version", "roi_floor_ok", "compiler", "python_header",
           "build_prerequisites", "load", "load_kernels", "status_line",
           "kernels_status_line", "main"]

_loaded: tuple | None = None
_kernels_loaded: tuple | None = None


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


def libjpeg_turbo_version(jpeglib_h: str | None = None) -> int | None:
    """``LIBJPEG_TURBO_VERSION_NUMBER`` of the headers a compile would use (e.g. 2001005 for
    2.1.5), read from the ``jconfig.h`` next to ``jpeglib_h`` (default :func:`jpeg_header`) or
    in the include dirs; 0 for another libjpeg (no ``LIBJPEG_TURBO_VERSION``); None when there
    is no ``jpeglib.h``."""
    jpeglib_h = jpeglib_h or jpeg_header()
    if jpeglib_h is None:
        return None
    for d in [os.path.dirname(jpeglib_h), *_include_dirs()]:
        path = os.path.join(d, "jconfig.h")
        if not os.path.isfile(path):
            continue
        with open(path, encoding="latin-1") as f:
            text = f.read()
        number = re.search(r"^\s*#\s*define\s+LIBJPEG_TURBO_VERSION_NUMBER\s+(\d+)", text, re.M)
        if number:
            return int(number.group(1))
        dotted = re.search(r"^\s*#\s*define\s+LIBJPEG_TURBO_VERSION\s+(\d+)\.(\d+)\.(\d+)",
                           text, re.M)
        if dotted:
            major, minor, patch = (int(v) for v in dotted.groups())
            return major * 1000000 + minor * 1000 + patch
        return 0
    return 0


def roi_floor_ok(version: int | None) -> bool:
    """Whether libjpeg-turbo ``version`` (``LIBJPEG_TURBO_VERSION_NUMBER``) is at the ROI floor
    of ``_jpegroi.c`` (``ROI_SAFE``): 2.0.6 or later, or 1.5.3 on the 1.5 branch (1.5.90 is 2.0
    beta1)."""
    return version is not None and (version >= 2000006 or 1005003 <= version < 1005090)


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
    """What building the extensions needs and what was found.

    Returns ``{"compiler": path|None, "jpeglib_h": path|None, "python_h": path|None,
    "libjpeg_turbo": int|None (see :func:`libjpeg_turbo_version`), "missing": [str],
    "can_build": bool, "roi_expected": bool, "kernels_missing": [str],
    "kernels_can_build": bool}``: ``missing`` / ``can_build`` for ``_jpegroi``, ``roi_expected``
    when it can be built and the headers are at the ROI floor (:func:`roi_floor_ok`: the ROI
    decoder must then be available), ``kernels_*`` for ``shardkit.augment._kernels``; each
    missing piece is named with the Debian package that provides it.
    """
    found = {"compiler": compiler(), "jpeglib_h": jpeg_header(), "python_h": python_header()}
    turbo = libjpeg_turbo_version(found["jpeglib_h"])
    hints = {"compiler": "a C compiler (gcc; Debian: build-essential)",
             "jpeglib_h": _TURBO_HINT,
             "python_h": "Python's headers (Python.h; Debian: python3-dev)"}
    missing = [hints[k] for k, v in found.items() if v is None]
    if turbo == 0:
        missing.append(f"{_TURBO_HINT}: {found['jpeglib_h']} is another libjpeg (its jconfig.h "
                       f"defines no LIBJPEG_TURBO_VERSION)")
    elif turbo is not None and turbo < 1005000:
        missing.append(f"{_TURBO_HINT}: {found['jpeglib_h']} is libjpeg-turbo "
                       f"{_dotted(turbo)}, older than 1.5")
    kernels_missing = [hints[k] for k in ("compiler", "python_h") if found[k] is None]
    return {**found, "libjpeg_turbo": turbo, "missing": missing, "can_build": not missing,
            "roi_expected": not missing and roi_floor_ok(turbo),
            "kernels_missing": kernels_missing, "kernels_can_build": not kernels_missing}


_TURBO_HINT = ("the libjpeg-turbo >= 1.5 headers (jpeglib.h; Debian: libjpeg62-turbo-dev, Ubuntu: "
               "libjpeg-turbo8-dev; `make sysdeps`)")


def _dotted(number: int) -> str:
    return f"{number // 1000000}.{number // 1000 % 1000}.{number % 1000}"


def _why_not(exc: Exception, missing: list[str]) -> str:
    return (f"{exc} (" + ("missing: " + "; ".join(missing) if missing else
                          "the build prerequisites are present: reinstall with `pip install -e . "
                          "-v` and read the compiler output") + ")")


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
            _loaded = (None, "_jpegroi not built: "
                       + _why_not(exc, build_prerequisites()["missing"]))
    return _loaded


def load_kernels() -> tuple:
    """Import ``shardkit.augment._kernels`` once per process: ``(module, None)`` or
    ``(None, reason)`` (``"_kernels not built: ..."``, as :func:`load`)."""
    global _kernels_loaded
    if _kernels_loaded is None:
        try:
            _kernels_loaded = (importlib.import_module("shardkit.augment._kernels"), None)
        except ImportError as exc:
            _kernels_loaded = (None, "_kernels not built: "
                               + _why_not(exc, build_prerequisites()["kernels_missing"]))
    return _kernels_loaded


def status_line() -> str:
    """One line: whether ``_jpegroi`` imports, its SIMD level and whether ROI decoding is on."""
    mod, reason = load()
    if mod is None:
        return f"shardkit.decode._jpegroi: NOT available: {reason}"
    level, best = mod.simd_level()
    names = {mod.SIMD_SCALAR: "scalar", mod.SIMD_SSE41: "sse4.1", mod.SIMD_AVX2: "avx2"}
    roi = ("ROI decoding on" if mod.ROI_SAFE else
           f"ROI decoding OFF (built against libjpeg-turbo "
           f"{_dotted(mod.LIBJPEG_TURBO_VERSION_NUMBER)}, below {mod.ROI_FLOOR})")
    return (f"shardkit.decode._jpegroi: built ({mod.__file__}); resize SIMD "
            f"{names.get(level, level)} (best here {names.get(best, best)}); {roi}")


def kernels_status_line() -> str:
    """One line: whether ``shardkit.augment._kernels`` imports (importing it imports
    ``shardkit.augment``, hence torch: the install check's business, not the decoders')."""
    mod, reason = load_kernels()
    if mod is None:
        return f"shardkit.augment._kernels: NOT available: {reason}"
    used, best = mod.path()
    names = {mod.PATH_PORTABLE: "portable", mod.PATH_FMA: "avx2+fma"}
    return (f"shardkit.augment._kernels: built ({mod.__file__}); code path "
            f"{names.get(used, used)} (best here {names.get(best, best)}; the same bytes)")


def main(argv: list[str] | None = None) -> int:
    """CLI (see the module docstring). Returns the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    if any(a not in ("--require",) for a in argv):
        print(f"usage: shardkit.decode.extensions.main([--require]); got {argv}", file=sys.stderr)
        return 2
    errors = []
    if "--require" in argv:
        pre = build_prerequisites()
        mod, reason = load()
        if mod is None and pre["can_build"]:
            errors.append(f"the libjpeg-turbo headers are installed ({pre['jpeglib_h']}, "
                          f"{_dotted(pre['libjpeg_turbo'])}) but the C extension "
                          f"shardkit.decode._jpegroi did not build or does not import, so the "
                          f"ROI decoder and the fused transform would be silently missing. "
                          f"{reason}")
        kernels, kreason = load_kernels()
        if kernels is None and pre["kernels_can_build"]:
            errors.append(f"a C compiler ({pre['compiler']}) and Python.h are installed but the "
                          f"C extension shardkit.augment._kernels did not build or does not "
                          f"import, so augmentation would silently run torchvision's slower "
                          f"tensor ops. {kreason}")
    for e in errors:
        print(f"error: {e}", file=sys.stderr)
    if errors:
        return 1
    print(status_line())
    print(kernels_status_line())
    return 0
