#!/usr/bin/env bash
# Build a peer's own virtual environment: benchmarks/peers/make_venv.sh PEER [DIR]
#   PEER: ffcv | ffcv-shared | dali | spdl | litdata | mosaic   DIR: default /tmp/<PEER>-venv
# Peers get their own venv so their pins never touch the project's .venv (FFCV needs numba and
# OpenCV; DALI and SPDL bring their own native libraries). System packages (Debian, as root):
#   ffcv: apt-get install -y pkg-config libopencv-dev libturbojpeg0-dev
#   spdl: apt-get install -y --no-install-recommends libavfilter8 libavdevice59  (FFmpeg 4-8)
# Then run the peer's script with DIR/bin/python (see benchmarks/peers/README.md).
# ffcv-shared: FFCV on top of the project's .venv (a .pth file points at its site-packages, so
#   torch and numpy are not downloaded again; FFCV and its small deps installed --no-deps so
#   .venv is never changed): ~40 s here instead of a multi-GB torch download. DIR default
#   /tmp/ffcv-venv, as for ffcv.
set -euo pipefail
peer="${1:?usage: make_venv.sh ffcv|ffcv-shared|dali|spdl|litdata|mosaic [DIR]}"
dir="${2:-/tmp/${peer}-venv}"
torch_pins=(torch==2.14.1 torchvision==0.29.1)  # the project's pins (pyproject.toml)
if [ "$peer" = ffcv-shared ]; then
  dir="${2:-/tmp/ffcv-venv}"
  root="$(cd "$(dirname "$0")/../.." && pwd)"
  "$root/.venv/bin/python" -m venv "$dir"
  "$root/.venv/bin/python" -c "import site; print(site.getsitepackages()[0])" \
    > "$("$dir/bin/python" -c "import site; print(site.getsitepackages()[0])")/project_venv.pth"
  "$dir/bin/python" -m pip install -q --no-deps numba llvmlite opencv-python-headless \
    terminaltables pytorch-pfn-extras fastprogress assertpy ffcv==1.0.2
  "$dir/bin/python" -m pip freeze > "$dir/peer-freeze.txt"
  echo "ffcv venv ready (on top of $root/.venv): $dir (versions in $dir/peer-freeze.txt)"
  exit 0
fi
case "$peer" in
  ffcv)    pkgs=("${torch_pins[@]}" numba opencv-python-headless ffcv==1.0.2) ;;
  dali)    pkgs=(nvidia-dali-cuda120) ;;
  spdl)    pkgs=("${torch_pins[@]}" spdl==0.8.0) ;;
  litdata) pkgs=("${torch_pins[@]}" litdata pillow numpy) ;;
  mosaic)  pkgs=("${torch_pins[@]}" mosaicml-streaming pillow numpy) ;;
  *) echo "unknown peer '$peer': expected ffcv, dali, spdl, litdata or mosaic" >&2; exit 2 ;;
esac
python3 -m venv "$dir"
"$dir/bin/python" -m pip install -q --upgrade pip
"$dir/bin/python" -m pip install -q "${pkgs[@]}"
"$dir/bin/python" -m pip freeze > "$dir/peer-freeze.txt"
echo "$peer venv ready: $dir (package versions in $dir/peer-freeze.txt)"
