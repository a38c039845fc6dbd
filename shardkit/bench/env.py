"""What really ran: CPU, library versions, the JPEG libraries mapped into this process (case 20).

pillow-simd and Pillow share the ``PIL`` namespace, so a later ``pip install`` of anything that
depends on ``pillow`` silently replaces pillow-simd (uploadcare/pillow-simd#81, #88). A benchmark
that says "pillow-simd" must therefore report the ``PIL`` that was imported, not the one that was
asked for: :func:`collect_environment` does, and lists every mismatch with the request.

Library paths are read from ``/proc/self/maps`` (the shared objects actually mapped), and the
libjpeg-turbo version from the ``"libjpeg-turbo version X.Y.Z"`` string that libjpeg-turbo
compiles into every build (``jversion.h``), because the TurboJPEG 2.x API has no version call.
"""
from __future__ import annotations

import importlib
import importlib.metadata as metadata
import os
import platform
import re
import sys
from pathlib import Path

__all__ = ["collect_environment", "describe_pil", "pil_mismatches", "mapped_libraries",
           "libjpeg_turbo_version_of", "EXPECT_PIL_CHOICES"]

EXPECT_PIL_CHOICES = ("any", "pillow", "pillow-simd")
_VERSION_RE = re.compile(rb"libjpeg-turbo version ([0-9][0-9A-Za-z.\-]*)")


def mapped_libraries(pattern: str) -> list[str]:
    """Paths of shared objects mapped into this process whose file name contains ``pattern``.

    Reads ``/proc/self/maps`` (Linux); returns ``[]`` elsewhere. Sorted, without duplicates.
    """
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            paths = {line.split()[-1] for line in fh if "/" in line}
    except OSError:
        return []
    return sorted(p for p in paths if pattern in Path(p).name)


def libjpeg_turbo_version_of(path: str | os.PathLike) -> str | None:
    """The libjpeg-turbo version string compiled into a shared object, or None if not found.

    Scans the file for ``b"libjpeg-turbo version X.Y.Z"`` (present in libjpeg and libturbojpeg
    builds of libjpeg-turbo, from ``jversion.h``).
    """
    try:
        data = Path(path).read_bytes()
    except OSError:
        return None
    match = _VERSION_RE.search(data)
    return match.group(1).decode("ascii") if match else None


def describe_pil(version: str | None = None, distributions: list[str] | None = None) -> dict:
    """Which ``PIL`` is loaded: stock Pillow or Pillow-SIMD, with version and JPEG library.

    Args:
        version: the ``PIL.__version__`` to classify; default the imported one.
        distributions: the installed distributions that provide the ``PIL`` package (for example
            ``["pillow"]``, or ``["pillow", "Pillow-SIMD"]`` after one overwrote the other);
            default from ``importlib.metadata``.

    Returns:
        ``{"version", "distributions", "simd", "libjpeg_turbo", "jpeg_library_path"}``; ``simd``
        is decided by :func:`shardkit.decode.pil.pil_flavor`, the one rule shardkit uses (a
        ``.postN`` version tag, Pillow-SIMD's release scheme, or a distribution named
        Pillow-SIMD providing ``PIL``).
    """
    from shardkit.decode.pil import pil_flavor, pil_info

    libs = mapped_libraries("libjpeg")
    return {**pil_flavor(version, distributions), "libjpeg_turbo": pil_info()["libjpeg_turbo"],
            "jpeg_library_path": libs[0] if libs else None}


def pil_mismatches(pil: dict, expect: str) -> list[str]:
    """Messages for each way the loaded ``PIL`` differs from the requested one.

    Args:
        pil: the output of :func:`describe_pil`.
        expect: one of ``EXPECT_PIL_CHOICES`` (``"any"`` never mismatches).

    Raises:
        ConfigError: ``expect`` is not one of ``EXPECT_PIL_CHOICES``.
    """
    from shardkit.errors import ConfigError

    if expect not in EXPECT_PIL_CHOICES:
        raise ConfigError(f"expect_pil={expect!r}; expected one of {EXPECT_PIL_CHOICES}")
    out = []
    if expect == "pillow-simd" and not pil["simd"]:
        out.append(f"pillow-simd was requested but stock Pillow {pil['version']} is loaded "
                   f"(distributions providing PIL: {pil['distributions']}; "
                   f"JPEG library {pil['jpeg_library_path']}); run `make simd` again")
    if expect == "pillow" and pil["simd"]:
        out.append(f"stock Pillow was requested but Pillow-SIMD {pil['version']} is loaded")
    if len(pil["distributions"]) > 1:
        out.append(f"several distributions provide PIL ({pil['distributions']}); the last one "
                   f"installed overwrote the others' files")
    return out


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _turbojpeg_info() -> dict:
    try:
        turbojpeg = importlib.import_module("turbojpeg")
        turbojpeg.TurboJPEG()  # loads (and so maps) the shared library
    except Exception as exc:  # noqa: BLE001 - reported, not raised: the env report must not fail
        return {"available": False, "error": f"{type(exc).__name__}: {exc}"}
    libs = mapped_libraries("libturbojpeg")
    return {"available": True, "pyturbojpeg": _dist_version("PyTurboJPEG"),
            "library_path": libs[0] if libs else None,
            "libjpeg_turbo": libjpeg_turbo_version_of(libs[0]) if libs else None}


def _dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _decoder_info(decoders: list[str]) -> dict:
    """shardkit's own decoder report, when ``shardkit.decode`` is importable."""
    try:
        decode = importlib.import_module("shardkit.decode")
    except Exception as exc:  # noqa: BLE001 - module still being written by another helper
        return {"available": False, "error": f"{type(exc).__name__}: {exc}"}
    out: dict = {"available": True}
    if hasattr(decode, "decoder_environment"):
        try:
            out["environment"] = decode.decoder_environment()
        except Exception as exc:  # noqa: BLE001
            out["environment_error"] = f"{type(exc).__name__}: {exc}"
    out["decoders"] = {}
    for name in decoders:
        try:
            out["decoders"][name] = decode.get_decoder(name).info()
        except Exception as exc:  # noqa: BLE001 - e.g. nvjpeg without CUDA: recorded per decoder
            out["decoders"][name] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def collect_environment(*, expect_pil: str = "any", decoders: list[str] | None = None) -> dict:
    """The environment a benchmark ran in, as a JSON-ready dict.

    Args:
        expect_pil: which ``PIL`` the run was meant to use (``EXPECT_PIL_CHOICES``).
        decoders: shardkit decoder names whose ``info()`` to record (default ``["auto"]``).

    Returns:
        ``{"python", "platform", "cpu": {"model", "logical_cores", "usable_cores"}, "torch":
        {"version", "cuda_available", "cuda", "device"}, "torchvision", "pil" (see
        :func:`describe_pil`), "turbojpeg": {"pyturbojpeg", "library_path", "libjpeg_turbo"},
        "shardkit_decode", "expect_pil", "mismatches": [str]}``.

    Raises:
        ConfigError: ``expect_pil`` is not a known choice.
    """
    import torch
    import torchvision

    import shardkit

    cuda = torch.cuda.is_available()
    pil = describe_pil()
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        usable = os.cpu_count()
    env = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "shardkit": shardkit.__version__,
        "cpu": {"model": _cpu_model(), "logical_cores": os.cpu_count(), "usable_cores": usable},
        "torch": {"version": torch.__version__, "cuda_available": cuda,
                  "cuda": torch.version.cuda,
                  "device": torch.cuda.get_device_name(0) if cuda else None},
        "torchvision": torchvision.__version__,
        "pil": pil,
        "turbojpeg": _turbojpeg_info(),
        "shardkit_decode": _decoder_info(decoders or ["auto"]),
        "expect_pil": expect_pil,
    }
    env["mismatches"] = pil_mismatches(pil, expect_pil)
    return env
