#!/usr/bin/env bash
# Fill the bundle that a lent GPU machine needs to run scripts/gpu_check.py:
#   scripts/gpu_check_bundle.sh [DIR]          (DIR default .gpu-bundle, in the repository root)
# Run it HERE (a machine that reaches PyPI and Debian's archive), before the device call. The GPU
# machine reaches no registry; its python3 (3.12, torch, torchvision, timm, numpy, Pillow, psutil,
# xxhash, h5py, pyyaml, click, pytest: the device README's package list) lacks the packages below,
# and its system lacks libjpeg-turbo's headers (for shardkit's C extension) and libturbojpeg (for
# PyTurboJPEG, which pack's image check uses). DIR gets:
#   wheels/  cp312 manylinux / pure-Python wheels, the versions of the project's .venv
#            (PyTurboJPEG's built here from its source archive)
#   debs/    Debian's libjpeg62-turbo, libjpeg62-turbo-dev, libturbojpeg0 (unpacked there into
#            /tmp, never into /)
# DIR is added to this checkout's .git/info/exclude (never committed); name it in the device
# call's `carry` (about 6 MB), then run scripts/gpu_check_device.sh there. PYVER=3.11 (say)
# fetches wheels for another Python (default 3.12, the GPU machine's).
# DALI is not bundled: its venv is ~1.1 GB, over the 64 MiB a device call carries, so (e) is
# recorded there as not run.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="${1:-$root/.gpu-bundle}"
py="${PY:-python3}"
mkdir -p "$dir/wheels" "$dir/debs"
# inside this checkout: ignored by git (so never committed), still carried when named
if exclude="$(git -C "$root" rev-parse --git-path info/exclude 2>/dev/null)"; then
  case "$exclude" in /*) ;; *) exclude="$root/$exclude" ;; esac
  rel="/${dir#"$root"/}/"
  if [ "${dir#"$root"/}" != "$dir" ] && ! grep -qxF "$rel" "$exclude" 2>/dev/null; then
    mkdir -p "$(dirname "$exclude")" && echo "$rel" >> "$exclude"
  fi
fi
# pure-Python and cp312 wheels; versions as in the project's .venv (pip freeze there)
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version "${PYVER:-3.12}" \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$dir/wheels" \
  lmdb==3.0.0 webdataset==1.0.2 braceexpand==0.1.7 ImageHash==4.3.2 PyWavelets==1.9.0
# PyTurboJPEG 1.8 is published as a source archive only: build its pure-Python wheel here
"$py" -m pip wheel -q --no-deps -w "$dir/wheels" PyTurboJPEG==1.8.3
# Debian's libjpeg-turbo (2.1.5 on bookworm): headers + libjpeg.so.62 + libturbojpeg.so.0
if command -v apt-get >/dev/null; then
  [ -n "$(ls /var/lib/apt/lists/*_Packages 2>/dev/null | head -1)" ] || apt-get update -qq
  (cd "$dir/debs" && apt-get download -qq libjpeg62-turbo libjpeg62-turbo-dev libturbojpeg0)
else
  echo "no apt-get here: put libjpeg62-turbo, libjpeg62-turbo-dev and libturbojpeg0 .debs in $dir/debs" >&2
  exit 2
fi
du -sh "$dir"
ls "$dir/wheels" "$dir/debs"
echo "bundle ready: carry '${dir#"$root"/}' and run: bash scripts/gpu_check_device.sh"
