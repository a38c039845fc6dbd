"""C extension builds (shardkit.decode._jpegroi, shardkit.augment._kernels); all metadata lives
in pyproject.toml.

``_jpegroi`` links the system libjpeg-turbo (``-ljpeg``, >= 1.5 for jpeg_crop_scanline and
jpeg_skip_scanlines; ROI decoding needs 2.0.6 or 1.5.3, see shardkit/decode/_jpegroi.c) and
builds on every architecture (portable C; x86 SIMD behind compile-time guards and runtime
dispatch, see shardkit/decode/_resample.c). ``_kernels`` needs no library; it is compiled with
``-ffp-contract=off`` and no ``-march`` so that its pixels are the same on every CPU (it refuses
to import if built with floating-point contraction).

Each extension is REQUIRED wherever it can be built (shardkit/decode/extensions.py,
``build_prerequisites``): ``_jpegroi`` when a C compiler, ``Python.h`` and libjpeg-turbo's
``jpeglib.h`` are found, ``_kernels`` when a compiler and ``Python.h`` are; a compile error then
fails the install instead of silently dropping the fast path. Where a piece is missing the
extension is optional (the install succeeds; the reason is printed here and logged at run time).
Where ``jpeglib.h`` is positively another libjpeg (IJG's, no ``LIBJPEG_TURBO_VERSION``) or older
than 1.5, ``_jpegroi`` is left out with the reason printed (its source would stop with
``#error``). ``SHARDKIT_OPTIONAL_EXT=1`` makes both optional everywhere (escape hatch for a broken
toolchain).
"""
import importlib.util
import os
from pathlib import Path

from setuptools import Extension, setup

HERE = Path(__file__).resolve().parent
DECODE = "shardkit/decode"


def _prerequisites() -> dict:
    # by path: shardkit itself is not importable while it is being built (stdlib-only module)
    spec = importlib.util.spec_from_file_location("_shardkit_ext", HERE / DECODE / "extensions.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.build_prerequisites()


_pre = _prerequisites()
_escape = os.environ.get("SHARDKIT_OPTIONAL_EXT") == "1"
_other_libjpeg = _pre["jpeglib_h"] is not None and (_pre["libjpeg_turbo"] or 0) < 1005000
_ext_modules = []
if _other_libjpeg:
    print("shardkit: building without the _jpegroi C extension (ROI decoder, fused transform); "
          + "; ".join(_pre["missing"]))
else:
    if not _pre["can_build"]:
        print("shardkit: the _jpegroi C extension is optional here; missing: "
              + "; ".join(_pre["missing"]))
    _ext_modules.append(Extension(
        "shardkit.decode._jpegroi",
        sources=[f"{DECODE}/_jpegroi.c", f"{DECODE}/_resample.c"],
        depends=[f"{DECODE}/_resample.h"],
        libraries=["jpeg"],
        extra_compile_args=["-O3"],
        optional=_escape or not _pre["can_build"],
    ))
if not _pre["kernels_can_build"]:
    print("shardkit: the _kernels C extension is optional here; missing: "
          + "; ".join(_pre["kernels_missing"]))
# uint8 augmentation kernels (no libjpeg): float32 arithmetic as torchvision's, the same bytes on
# every CPU: no contraction into FMAs the reference does not do, no -march
_ext_modules.append(Extension(
    "shardkit.augment._kernels",
    sources=["shardkit/augment/_kernels.c"],
    libraries=["m"],
    extra_compile_args=["-O3", "-ffp-contract=off", "-fno-math-errno"],
    optional=_escape or not _pre["kernels_can_build"],
))

setup(ext_modules=_ext_modules)
