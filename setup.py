"""Optional C extension build (shardkit.decode._jpegroi); all metadata lives in pyproject.toml.

The extension links the system libjpeg-turbo (``-ljpeg``, >= 1.5 for jpeg_crop_scanline and
jpeg_skip_scanlines). It is ``optional=True``: when headers or the compiler are missing the
install still succeeds and shardkit falls back to PyTurboJPEG / Pillow.
"""
from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "shardkit.decode._jpegroi",
            sources=["shardkit/decode/_jpegroi.c", "shardkit/decode/_resample.c"],
            libraries=["jpeg"],
            extra_compile_args=["-O3"],
            optional=True,
        )
    ]
)
