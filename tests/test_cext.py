"""The C extensions: ``_jpegroi`` is built wherever it can be, compiles off x86, every SIMD level
gives the same bytes, refuses crafted files over its scan and memory limits and ROI decoding
below its library floor, stops with ``#error`` on another libjpeg's headers (which setup.py
leaves out with the reason instead of failing the install); ``make install``'s check refuses an
install that lost ``_jpegroi`` or ``shardkit.augment._kernels``, and a missing ``_kernels`` warns
once at import.

Nothing here skips where the extension can be built (a compiler, ``jpeglib.h`` and ``Python.h``:
``shardkit.decode.extensions.build_prerequisites``); the aarch64 compile skips, naming why, when no
cross toolchain is installed (none is downloaded).
"""
from __future__ import annotations

import importlib.util
import io
import logging
import os
import shutil
import struct
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import shardkit.decode as decode_pkg
from shardkit.decode import extensions as _ext, resize_into, roi
from shardkit.errors import ConfigError, DecodeError

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
    pre = _ext.build_prerequisites()
    assert mod.LIBJPEG_TURBO_VERSION_NUMBER == pre["libjpeg_turbo"]  # the headers it was built with
    assert bool(mod.ROI_SAFE) is pre["roi_expected"] is roi.ROIDecoder.available()


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
    """Scalar C, SSE4.1 and AVX2 horizontal passes and the scalar and AVX2 vertical passes:
    identical output, equal to Pillow's (stock Pillow; SIMD Pillow rounds differently). Row
    counts not a multiple of 4, rows whose bytes are not a multiple of 32 and boxes touching
    the right edge exercise the AVX2 -> SSE4.1 -> scalar hand-offs."""
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


def _copy_without_extension(dst: Path, keep: tuple[str, ...] = ()) -> Path:
    """A copy of the package without its built extensions, except those named in ``keep``
    (file-name prefixes such as ``"_jpegroi"``)."""
    def ignore(folder, names):
        return [n for n in names if n == "__pycache__" or (
            n.endswith((".so", ".pyd")) and not n.startswith(keep))]
    shutil.copytree(ROOT / "shardkit", dst / "shardkit", ignore=ignore)
    return dst


_REQUIRE = "import sys; from shardkit.decode.extensions import main; sys.exit(main(['--require']))"


def _run_copy(copy: Path, code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=copy, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(copy)})


def test_install_check_fails_loudly_without_the_extension(tmp_path):
    """``make install`` runs ``_ext.main(['--require'])``: it must exit 1 with a clear message
    where the headers exist but the extension does not import (a copy of the package without
    the built .so), and exit 0 on the real install."""
    _jpegroi()
    copy = _copy_without_extension(tmp_path)
    res = _run_copy(copy, _REQUIRE)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "the libjpeg-turbo headers are installed" in res.stderr
    assert "_jpegroi not built: No module named 'shardkit.decode._jpegroi'" in res.stderr
    assert "shardkit.augment._kernels did not build or does not import" in res.stderr
    ok = subprocess.run([sys.executable, "-c", _REQUIRE], cwd=ROOT, capture_output=True,
                        text=True)
    assert ok.returncode == 0 and "_jpegroi: built" in ok.stdout, ok.stdout + ok.stderr
    assert "ROI decoding on" in ok.stdout and "_kernels: built" in ok.stdout, ok.stdout


def test_install_check_requires_the_augmentation_kernels(tmp_path):
    """``_kernels`` needs only a compiler and Python.h: an install that has ``_jpegroi`` but lost
    ``_kernels`` fails the check, naming it (it used to fall back to Python silently)."""
    pre = _prereqs()
    assert pre["kernels_can_build"]
    copy = _copy_without_extension(tmp_path, keep=("_jpegroi",))
    res = _run_copy(copy, _REQUIRE)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "_jpegroi" not in res.stderr.split("error: ")[1].split()[0]
    assert res.stderr.count("error: ") == 1, res.stderr
    assert ("a C compiler" in res.stderr and "shardkit.augment._kernels did not build or does "
            "not import" in res.stderr and "No module named 'shardkit.augment._kernels'"
            in res.stderr), res.stderr


def test_missing_kernels_warn_once_at_import(tmp_path):
    """Without ``_kernels`` the augmentation primitives still work (torch path) and one warning
    at import says why."""
    copy = _copy_without_extension(tmp_path, keep=("_jpegroi",))
    res = _run_copy(copy, "import shardkit.augment.prims as p, numpy as np; "
                          "row = np.full((8, 8, 3), 100, np.uint8); "
                          "p.apply_hwc(row, [('brightness', (1.5,))]); "
                          "print(p.fast_path_available(), row[0, 0, 0])")
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["False", "150"]
    lines = [ln for ln in res.stderr.splitlines() if "augment._kernels is not available" in ln]
    assert len(lines) == 1, res.stderr
    assert "No module named 'shardkit.augment._kernels'" in lines[0], lines


# ---------------------------------------------------------------- library version and headers
def _compile(wrapper_text: str, tmp_path: Path, name: str, *extra: str,
             syntax_only: bool = True) -> subprocess.CompletedProcess:
    pre = _prereqs()
    wrapper = tmp_path / f"{name}.c"
    wrapper.write_text(wrapper_text)
    out = tmp_path / f"{name}{sysconfig.get_config_var('EXT_SUFFIX')}"
    cmd = [pre["compiler"], "-O1", "-Wall", "-fPIC", f"-I{sysconfig.get_paths()['include']}",
           f"-I{DECODE}", str(wrapper), *extra]
    cmd += ["-fsyntax-only"] if syntax_only else ["-shared", "-o", str(out), "-ljpeg"]
    return subprocess.run(cmd, capture_output=True, text=True)


def _with_version(number: int, tail: str = "") -> str:
    """_jpegroi.c as built against libjpeg-turbo headers that report ``number``."""
    return ("#include <Python.h>\n#include <stdio.h>\n#include <jpeglib.h>\n"
            "#undef LIBJPEG_TURBO_VERSION_NUMBER\n"
            f"#define LIBJPEG_TURBO_VERSION_NUMBER {number}\n"
            f'#include "{DECODE / "_jpegroi.c"}"\n' + tail)


def test_other_libjpeg_headers_stop_the_build_with_a_clear_error(tmp_path):
    """IJG's libjpeg (no LIBJPEG_TURBO_VERSION) or a libjpeg-turbo older than 1.5: #error."""
    res = _compile("#include <Python.h>\n#include <stdio.h>\n#include <jpeglib.h>\n"
                   "#undef LIBJPEG_TURBO_VERSION\n#undef LIBJPEG_TURBO_VERSION_NUMBER\n"
                   f'#include "{DECODE / "_jpegroi.c"}"\n', tmp_path, "ijg")
    assert res.returncode != 0 and "needs libjpeg-turbo's headers" in res.stderr, res.stderr
    res = _compile(_with_version(1004002), tmp_path, "old")
    assert res.returncode != 0 and "needs libjpeg-turbo >= 1.5" in res.stderr, res.stderr


@pytest.mark.parametrize("number,safe", [(1005000, 0), (1005002, 0), (1005003, 1), (1005090, 0),
                                         (2000005, 0), (2000006, 1), (2001005, 1), (3000004, 1)])
def test_roi_floor_is_2_0_6_or_1_5_3(number, safe, tmp_path):
    assert _ext.roi_floor_ok(number) is bool(safe)  # the Python mirror the tests rely on
    res = _compile(_with_version(number, f"_Static_assert(ROI_SAFE == {safe}, \"floor\");\n"),
                   tmp_path, f"v{number}")
    assert res.returncode == 0, res.stderr


@pytest.fixture(scope="module")
def old_jpegroi(tmp_path_factory):
    """The extension as built against libjpeg-turbo 2.0.5 headers (below the floor)."""
    tmp = tmp_path_factory.mktemp("old_jpegroi")
    res = _compile(_with_version(2000005), tmp, "_jpegroi", str(DECODE / "_resample.c"),
                   syntax_only=False)
    assert res.returncode == 0, res.stderr
    path = tmp / f"_jpegroi{sysconfig.get_config_var('EXT_SUFFIX')}"
    spec = importlib.util.spec_from_file_location("_jpegroi", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_below_the_floor_windows_are_refused_and_auto_falls_back_once(old_jpegroi, monkeypatch,
                                                                      caplog, sample_dir):
    data = sorted(sample_dir.rglob("*.jpg"))[0].read_bytes()
    assert old_jpegroi.ROI_SAFE == 0 and old_jpegroi.LIBJPEG_TURBO_VERSION_NUMBER == 2000005
    with pytest.raises(RuntimeError, match=r"ROI decoding is disabled: built against "
                                           r"libjpeg-turbo .*below libjpeg-turbo 2\.0\.6"):
        old_jpegroi.decode(data, 8, 16, 40, 30, 8, 0)
    whole = old_jpegroi.decode(data, 0, 0, 0, 0, 8, 0)  # no skip / crop: still served
    assert whole[0] == _jpegroi().decode(data, 0, 0, 0, 0, 8, 0)[0]
    monkeypatch.setattr(roi, "_jpegroi", old_jpegroi)
    monkeypatch.setattr(decode_pkg, "_said", set())
    assert not roi.ROIDecoder.available()
    reason = roi.ROIDecoder.unavailable_reason()
    assert "2.0.5" in reason and "below libjpeg-turbo 2.0.6" in reason
    assert "CVE-2020-35538" in reason
    with caplog.at_level(logging.WARNING, logger="shardkit.decode"):
        names = {decode_pkg.get_decoder("auto").name for _ in range(3)}
    assert "roi" not in names and len(names) == 1
    warned = [r for r in caplog.records if "below libjpeg-turbo 2.0.6" in r.getMessage()]
    assert len(warned) == 1, [r.getMessage() for r in caplog.records]
    with pytest.raises(ConfigError, match="below libjpeg-turbo 2.0.6"):
        decode_pkg.get_decoder("roi")


def _fake_headers(folder: Path, jconfig: str) -> Path:
    folder.mkdir()
    (folder / "jpeglib.h").write_text("/* a fake jpeglib.h */\n#include \"jconfig.h\"\n")
    (folder / "jconfig.h").write_text(jconfig)
    return folder


@pytest.mark.parametrize("jconfig,expected", [
    ("#define JPEG_LIB_VERSION 90\n", "is another libjpeg"),
    ("#define JPEG_LIB_VERSION 62\n#define LIBJPEG_TURBO_VERSION 1.4.2\n", "older than 1.5"),
    ("#define JPEG_LIB_VERSION 62\n#define LIBJPEG_TURBO_VERSION 2.1.5\n"
     "#define LIBJPEG_TURBO_VERSION_NUMBER 2001005\n", None),
])
def test_build_prerequisites_read_which_libjpeg_the_headers_are(jconfig, expected, tmp_path):
    inc = _fake_headers(tmp_path / "include", jconfig)
    code = ("import json; from shardkit.decode import extensions as _ext; "
            "print(json.dumps(_ext.build_prerequisites()))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "CPATH": str(inc), "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, res.stderr
    import json
    pre = json.loads(res.stdout)
    assert pre["jpeglib_h"] == str(inc / "jpeglib.h") and pre["kernels_can_build"]
    if expected is None:
        assert pre["can_build"] and pre["libjpeg_turbo"] == 2001005
    else:
        assert not pre["can_build"] and any(expected in m for m in pre["missing"]), pre


def test_setup_leaves_jpegroi_out_on_another_libjpeg_and_still_builds_the_kernels(tmp_path):
    """A clean fallback, not a failed install: with IJG headers first on the include path,
    setup.py prints why ``_jpegroi`` is left out and builds ``_kernels``."""
    _prereqs()
    inc = _fake_headers(tmp_path / "include", "#define JPEG_LIB_VERSION 90\n")
    src = tmp_path / "src"
    _copy_without_extension(src)
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    res = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=src,
                         capture_output=True, text=True,
                         env={**os.environ, "CPATH": str(inc), "PYTHONPATH": str(src)})
    assert res.returncode == 0, res.stdout + res.stderr
    assert "building without the _jpegroi C extension" in res.stdout
    assert "is another libjpeg" in res.stdout
    assert list((src / "shardkit" / "augment").glob("_kernels*.so"))
    assert not list((src / "shardkit" / "decode").glob("_jpegroi*.so"))


# ---------------------------------------------------------------- untrusted files: limits
def _progressive(w: int, h: int) -> bytes:
    """A real progressive 4:4:4 JPEG (Pillow's scan script: 10 scans) of a smooth image."""
    rng = np.random.default_rng(w * h)
    img = Image.fromarray(rng.integers(0, 256, (h // 16 + 2, w // 16 + 2, 3), dtype=np.uint8))
    buf = io.BytesIO()
    img.resize((w, h), Image.BILINEAR).save(buf, "JPEG", quality=90, progressive=True,
                                            subsampling=0)
    return buf.getvalue()


def _segments(data: bytes) -> list[tuple[int, bytes]]:
    """The JPEG's marker segments in order, ``(marker, bytes)``; an SOS segment includes its
    entropy-coded data (up to the next marker other than RSTn / stuffed 0xFF00)."""
    out, i = [], 2
    while data[i + 1] != 0xD9:
        marker = data[i + 1]
        j = i + 2 + struct.unpack(">H", data[i + 2:i + 4])[0]
        if marker == 0xDA:
            while data[j] != 0xFF or data[j + 1] == 0 or 0xD0 <= data[j + 1] <= 0xD7:
                j += 1
        out.append((marker, data[i:j]))
        i = j
    return out


def _many_scans(data: bytes, scans: int) -> bytes:
    """``data`` with its smallest scan repeated to ``scans`` scans in all: what a crafted
    progressive file does to cost a decoder minutes (libjpeg decodes each, with a warning)."""
    segs = _segments(data)
    sos = [k for k, (m, _) in enumerate(segs) if m == 0xDA]
    smallest = min(sos, key=lambda k: len(segs[k][1]))
    return (b"\xff\xd8" + b"".join(seg for _, seg in segs) + segs[smallest][1] * (scans - len(sos))
            + b"\xff\xd9")


def test_a_progressive_file_with_too_many_scans_is_refused(tmp_path):
    mod = _jpegroi()
    honest = _progressive(256, 192)
    assert sum(m == 0xDA for m, _ in _segments(honest)) == 10
    dec = roi.ROIDecoder()
    assert dec.max_scans == mod.DEFAULT_MAX_SCANS == 500
    ok = dec.decode_region(honest, (16, 8, 200, 150), 1)
    assert ok.shape == (142, 184, 3) and dec.last_warnings == 0
    assert np.array_equal(ok, np.asarray(Image.open(io.BytesIO(honest)).convert("RGB"))
                          [8:150, 16:200])
    at_limit = _many_scans(honest, 500)
    dec.decode_region(at_limit, (0, 0, 256, 192), 1)  # 500 scans: decoded (with warnings)
    assert dec.last_warnings > 0
    crafted = _many_scans(honest, 4000)
    for call in (lambda: dec.decode_region(crafted, (16, 8, 200, 150), 1),
                 lambda: dec.decode(crafted),
                 lambda: dec.decode_resize(crafted, (0, 0, 256, 192), 1, (0, 0, 256, 192),
                                           np.empty((64, 64, 3), np.uint8))):
        with pytest.raises(DecodeError, match="more than 500 scans"):
            call()
    dec.max_scans = 9  # the limit is the decoder's: the honest file's 10th scan is refused
    with pytest.raises(DecodeError, match="more than 9 scans"):
        dec.decode(honest)


def test_memory_limit_refuses_what_libjpeg_would_allocate():
    mod = _jpegroi()
    prog = _progressive(1024, 768)  # coefficient buffer: 3 x 128 x 96 blocks x 128 bytes
    need = 3 * 128 * 96 * 128
    with pytest.raises(RuntimeError, match=f"needs {need} bytes of coefficient memory, over the "
                                           f"1048576-byte memory limit"):
        mod.decode(prog, 0, 0, 0, 0, 8, 0, 500, 1 << 20)
    # just above the buffer: libjpeg's own limit (cinfo->mem->max_memory_to_use) refuses it
    with pytest.raises(RuntimeError, match="needs more than the .*-byte memory limit"):
        mod.decode(prog, 0, 0, 0, 0, 8, 0, 500, need + 1000)
    assert len(mod.decode(prog, 0, 0, 0, 0, 8, 0, 500, need + (1 << 20))[0]) == 1024 * 768 * 3
    baseline = io.BytesIO()
    Image.open(io.BytesIO(prog)).save(baseline, "JPEG", quality=90)
    assert len(mod.decode(baseline.getvalue(), 0, 0, 0, 0, 8, 0, 500, 1 << 20)[0]) == 1024 * 768 * 3
    for bad in ((0, 1 << 30), (500, 1000), (500, -1)):
        with pytest.raises(ValueError, match="limits: max_scans"):
            mod.decode(prog, 0, 0, 0, 0, 8, 0, *bad)
    dec = roi.ROIDecoder(max_pixels=1024 * 768)
    assert dec.max_memory == 8 * 1024 * 768 + (32 << 20)
    assert dec.decode(prog).shape == (768, 1024, 3)
