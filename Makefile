# shardkit: `make demo` runs the main job on the embedded sample; `make test` runs the tests.
SHELL := /bin/bash
PY := .venv/bin/python
SK := .venv/bin/shardkit
STAMP := .venv/.installed

SRC ?= examples/flowers-sample
OUT ?= out/pack
FORMAT ?= wds
PACK_ARGS ?=
FLOWERS ?= ../shared/data/flowers

.PHONY: install test test-fast demo pack bench bench-full gpu-check train simd clean sysdeps

install: $(STAMP)

# System packages (Debian): libjpeg-turbo's TurboJPEG library for PyTurboJPEG 1.8, and the
# libjpeg-turbo headers for shardkit's ROI-decoding C extension.
sysdeps:
	@if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	  dpkg -s libturbojpeg0 libjpeg62-turbo-dev >/dev/null 2>&1 || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libturbojpeg0 libjpeg62-turbo-dev; }; \
	else echo "note: not root or no apt-get; install libturbojpeg0 and libjpeg62-turbo-dev yourself"; fi

# The C extensions must import wherever they can be built: _jpegroi where a compiler, Python.h and
# libjpeg-turbo's headers are installed, _kernels where a compiler and Python.h are (the check
# fails the install with the reason otherwise, instead of the ROI decoder, the fused transform or
# the augmentation kernels silently falling back).
$(STAMP): pyproject.toml setup.py shardkit/decode/_jpegroi.c shardkit/decode/_resample.c \
          shardkit/augment/_kernels.c \
          shardkit/decode/_resample.h
	$(MAKE) sysdeps
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.14.1 torchvision==0.29.1
	$(PY) -m pip install -q -e '.[test,ray]'
	$(PY) -c "import sys; from shardkit.decode.extensions import main; sys.exit(main(['--require']))"
	$(PY) -c "import shardkit, PIL, turbojpeg; print('shardkit', shardkit.__version__, '| PIL', PIL.__version__)"
	touch $(STAMP)

test: install
	$(PY) -m pytest -q tests

test-fast: install
	$(PY) -m pytest -q -m "not slow" tests

demo: install
	$(PY) -m shardkit.demo

pack: install
	$(SK) pack "$(SRC)" "$(OUT)" --format $(FORMAT) $(PACK_ARGS)

bench: install
	$(PY) benchmarks/run_all.py --quick

bench-full: install
	$(PY) benchmarks/run_all.py --data $(FLOWERS)

# The prepared GPU check (scripts/gpu_check.py; benchmarks/README.md "GPU check"): GPU tests,
# a generated ImageNet-like set packed, hrnet_w18_small fed by each pipeline; under 8 minutes on
# one H200. GPU_CHECK_ARGS="--dry-run" runs it on the CPU with tiny sizes.
GPU_CHECK_ARGS ?=
gpu-check: install
	$(PY) scripts/gpu_check.py $(GPU_CHECK_ARGS)

train: install
	$(SK) train $(OUT) --out runs/train $(TRAIN_ARGS)

# Swap Pillow for Pillow-SIMD (same `PIL` namespace; torchvision depends on `pillow`, so this is an
# explicit step). Prints which PIL really loaded afterwards.
simd: install
	$(PY) -m pip uninstall -y -q pillow pillow-simd || true
	CC="cc -mavx2" $(PY) -m pip install -q --no-cache-dir --no-binary pillow-simd pillow-simd
	$(PY) -c "import PIL; from PIL import features; print('PIL', PIL.__version__, 'libjpeg_turbo', features.version('libjpeg_turbo'))"

clean:
	rm -rf out runs bench-results
