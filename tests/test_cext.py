"""The ``_jpegroi`` C extension: built wherever it can be, compiles off x86, every SIMD level gives
the same bytes, and ``make install``'s check refuses an install that lost it.

Nothing here skips where the extension can be built (a compiler, ``jpeglib.h`` and ``Python.h``:
``shardkit.decode._ext.build_prerequisites``); the aarch64 compile skips, naming why, when no
cross toolchain is installed (none is downloaded).
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from shardkit.decode import _ext, resize_into

ROOT = Path(__file__).resolve().parents[1]
DECODE = ROOT / "shardkit" / "decode"
SOURCES = ("_resample.c", "_jpegroi.c")
# every macro an x86 compiler predefines that the sources (or immintrin.h) could key on
X86_MACROS = ("__x86_64__", "__x86_64", "__amd64__", "__amd64", "__i386__", "__i386", "i386",
              "__SSE__", "__SSE2__", "__SSE3__", "__SSSE3__", "__SSE4_1__", "__SSE4_2__",
              "__AVX__", "__AVX2__", "__MMX__")


def _prereqs() -> dict:
    pre = _ext.build_prerequisites()
    if not pre["can_build"]:
        pytest.skip("the C extension cannot be built here: missing " + "; ".join(pre["missing"]))
    return pre


def _jpegroi():
    """The extension; a FAILURE (not a skip) where it can be built."""
    _prereqs()
    mod, reason = _ext.load()
    if mod is None:
        pytest.fail(f"_jpegroi must be built here (prerequisites present): {reason}")
    return mod


def test_extension_is_built_where_it_can_be():
    mod = _jpegroi()
    level, best = mod.simd_level()
    assert level == best and mod.SIMD_SCALAR <= best <= mod.SIMD_AVX2


@pytest.mark.parametrize("source", SOURCES)
def test_sources_compile_with_x86_macros_undefined(source, tmp_path):
    """What an aarch64 (Graviton, Apple silicon VM) build sees of the sources: no x86 macro.

    The system headers are included first with the host's macros (glibc's own headers need
    them), then every x86 macro is #undef'd before the source is included: its guards must
    leave plain C only. (The old _resample.c failed here: its AVX2 routine sat outside the
    guard: "unknown type name '__m256i'".)"""
    pre = _prereqs()
    wrapper = tmp_path / f"noarch_{source}"
    wrapper.write_text(
        "#include <Python.h>\n#include <math.h>\n#include <setjmp.h>\n#include <stdio.h>\n"
        "#include <stdlib.h>\n#include <string.h>\n#include <jpeglib.h>\n"
        + "".join(f"#undef {m}\n" for m in X86_MACROS)
        + f'#include "{DECODE / source}"\n')
    obj = tmp_path / f"{source}.o"
    cmd = [pre["compiler"], "-O2", "-Wall", "-Werror", "-fPIC", "-c", str(wrapper), "-o",
           str(obj), f"-I{sysconfig.get_paths()['include']}", f"-I{DECODE}"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stderr}"
    assert obj.stat().st_size > 0
    nm = shutil.which("nm")
    if nm:  # no x86 SIMD symbol survived
        syms = subprocess.run([nm, str(obj)], capture_output=True, text=True).stdout
        assert "sse41" not in syms and "avx2" not in syms, syms


@pytest.mark.parametrize("source", SOURCES)
def test_sources_compile_for_aarch64(source, tmp_path):
    """A real aarch64 compile when a cross compiler or clang with an aarch64 sysroot is here."""
    cands = [[c] for c in ("aarch64-linux-gnu-gcc",) if shutil.which(c)]
    if shutil.which("clang"):
        cands.append(["clang", "--target=aarch64-linux-gnu"])
    probe = tmp_path / "probe.c"
    probe.write_text("#include <stdlib.h>\n#include <jpeglib.h>\nint f(void) { return 0; }\n")
    usable = [c for c in cands
              if subprocess.run([*c, "-fsyntax-only", str(probe)], capture_output=True)
              .returncode == 0]
    if not usable:
        pytest.skip("no aarch64 toolchain here (aarch64-linux-gnu-gcc, or clang with an "
                    f"aarch64 sysroot and libjpeg headers); tried {cands or 'none found'}")
    cmd = [*usable[0], "-fsyntax-only", "-Wall", "-Werror",
           f"-I{sysconfig.get_paths()['include']}", str(DECODE / source)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stderr}"


@pytest.fixture
def simd_levels():
    """Every SIMD level this CPU has; restores the best one afterwards."""
    mod = _jpegroi()
    best = mod.simd_level()[1]
    yield mod, list(range(mod.SIMD_SCALAR, best + 1))
    assert mod._set_simd(best) == best


@pytest.mark.parametrize("interp", ["bilinear", "bicubic", "box"])
def test_every_simd_level_gives_the_same_bytes(interp, simd_levels, sample_dir):
    """Scalar C, SSE4.1 and AVX2 horizontal passes: identical output, equal to Pillow's
    (stock Pillow; SIMD Pillow rounds differently). Row counts not a multiple of 4 and boxes
    touching the right edge exercise the AVX2 -> SSE4.1 -> scalar hand-offs."""
    mod, levels = simd_levels
    assert mod._set_simd(99) == levels[-1] and mod._set_simd(-5) == mod.SIMD_SCALAR
    stock = ".post" not in Image.__version__
    rng = np.random.default_rng(7)
    code = {"bilinear": 2, "bicubic": 3, "box": 4}[interp]
    files = sorted(sample_dir.rglob("*.jpg"))[::40][:5]
    for path in files:
        img = Image.open(path).convert("RGB")
        src = np.asarray(img)
        h, w = src.shape[:2]
        for _ in range(8):
            x0, y0 = rng.uniform(0, w / 2), rng.uniform(0, h / 2)
            box = (x0, y0, rng.uniform(x0 + 1, w) if rng.random() < 0.5 else w,
                   rng.uniform(y0 + 1, h))
            ow, oh = int(rng.integers(1, 260)), int(rng.integers(1, 263))
            flip = bool(rng.random() < 0.5)
            outs = []
            for level in levels:
                assert mod._set_simd(level) == level
                outs.append(resize_into(src, box, np.empty((oh, ow, 3), np.uint8), flip, interp))
            for level, out in zip(levels[1:], outs[1:]):
                assert np.array_equal(out, outs[0]), (path.name, box, ow, oh, flip, level)
            if stock:
                ref = np.asarray(img.resize((ow, oh), code, box=box))
                assert np.array_equal(outs[0], ref[:, ::-1] if flip else ref)


def _copy_without_extension(dst: Path) -> Path:
    shutil.copytree(ROOT / "shardkit", dst / "shardkit",
                    ignore=shutil.ignore_patterns("*.so", "*.pyd", "__pycache__"))
    return dst


def test_install_check_fails_loudly_without_the_extension(tmp_path):
    """``make install`` runs ``_ext.main(['--require'])``: it must exit 1 with a clear message
    where the headers exist but the extension does not import (a copy of the package without
    the built .so), and exit 0 on the real install."""
    _jpegroi()
    code = "import sys; from shardkit.decode._ext import main; sys.exit(main(['--require']))"
    copy = _copy_without_extension(tmp_path)
    res = subprocess.run([sys.executable, "-c", code], cwd=copy, capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(copy)})
    assert res.returncode == 1, res.stdout + res.stderr
    assert "the libjpeg headers are installed" in res.stderr
    assert "_jpegroi not built: No module named 'shardkit.decode._jpegroi'" in res.stderr
    ok = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert ok.returncode == 0 and "_jpegroi: built" in ok.stdout, ok.stdout + ok.stderr
