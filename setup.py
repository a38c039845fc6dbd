"""C extension build (shardkit.decode._jpegroi); all metadata lives in pyproject.toml.

The extension links the system libjpeg-turbo (``-ljpeg``, >= 1.5 for jpeg_crop_scanline and
jpeg_skip_scanlines) and builds on every architecture (portable C; x86 SIMD behind compile-time
guards and runtime dispatch, see shardkit/decode/_resample.c).

It is REQUIRED wherever it can be built: when a C compiler, ``jpeglib.h`` and ``Python.h`` are
all found (shardkit/decode/_ext.py, ``build_prerequisites``), a compile error fails the install
instead of silently dropping the ROI decoder and the fused transform. Only where something is
missing is it optional (the install then succeeds and ``get_decoder("auto")`` logs a warning
naming what is missing). ``SHARDKIT_OPTIONAL_EXT=1`` makes it optional everywhere (escape hatch
for a broken toolchain).
"""
import importlib.util
import os
from pathlib import Path

from setuptools import Extension, setup

HERE = Path(__file__).resolve().parent
DECODE = "shardkit/decode"


def _prerequisites() -> dict:
    # by path: shardkit itself is not importable while it is being built (stdlib-only module)
    spec = importlib.util.spec_from_file_location("_shardkit_ext", HERE / DECODE / "_ext.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.build_prerequisites()


_pre = _prerequisites()
_optional = not _pre["can_build"] or os.environ.get("SHARDKIT_OPTIONAL_EXT") == "1"
if not _pre["can_build"]:
    print("shardkit: building without the _jpegroi C extension; missing: "
          + "; ".join(_pre["missing"]))

setup(
    ext_modules=[
        Extension(
            "shardkit.decode._jpegroi",
            sources=[f"{DECODE}/_jpegroi.c", f"{DECODE}/_resample.c"],
            depends=[f"{DECODE}/_resample.h"],
            libraries=["jpeg"],
            extra_compile_args=["-O3"],
            optional=_optional,
        ),
        # uint8 augmentation kernels (no libjpeg): float32 arithmetic as torchvision's, so no
        # contraction into FMAs the reference does not do
        Extension(
            "shardkit.augment._kernels",
            sources=["shardkit/augment/_kernels.c"],
            extra_compile_args=["-O3", "-ffp-contract=off", "-fno-math-errno"],
            optional=_optional,
        ),
    ]
)
