#!/usr/bin/env bash
# Run scripts/gpu_check.py on a GPU machine that reaches no package registry, from this
# repository's root, with the bundle made by scripts/gpu_check_bundle.sh:
#   bash scripts/gpu_check_device.sh [gpu_check.py ARGS...]
# Environment: PY (default python3: the interpreter that holds torch there), BUNDLE (default
# .gpu-bundle), OUT (optional: a folder for the results; the JSON and a log archive go there),
# NO_LDCONFIG=1 (leave /etc alone: only LD_LIBRARY_PATH; for a trial on a shared machine).
# Steps (each prints one line; any failure stops here with its reason):
#   1. the bundle's wheels -> /tmp/gpu-check-site (pip --no-index --no-deps --target)
#   2. its .debs unpacked into /tmp/gpu-check-jpeg (dpkg -x, never into /); that lib folder is
#      added to the dynamic linker's search (ld.so.conf.d + ldconfig when root, and
#      LD_LIBRARY_PATH), so PyTurboJPEG finds libturbojpeg.so.0 and the extension libjpeg.so.62
#   3. shardkit's C extensions built in place for this Python (setup.py build_ext --inplace,
#      headers from the bundle via CPATH) and checked (`_ext main --require`)
#   4. scripts/gpu_check.py with PYTHONPATH=<repo>:/tmp/gpu-check-site (no install needed)
# Expected time on one H200 with 16 cores: steps 1-3 about 30 s, step 4 under 8 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PY:-python3}"
bundle="${BUNDLE:-.gpu-bundle}"
site=/tmp/gpu-check-site
jpeg=/tmp/gpu-check-jpeg
[ -d "$bundle/wheels" ] || { echo "Error: no $bundle/wheels: run scripts/gpu_check_bundle.sh where a registry is reachable and carry $bundle" >&2; exit 2; }
t0=$(date +%s)
"$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$site" "$bundle"/wheels/*.whl
echo "1. wheels installed in $site: $(ls "$bundle"/wheels | tr '\n' ' ')"
mkdir -p "$jpeg"
for f in "$bundle"/debs/*.deb; do
  if command -v dpkg >/dev/null; then dpkg -x "$f" "$jpeg"
  else (tmp=$(mktemp -d) && cd "$tmp" && ar x "$OLDPWD/$f" && tar -xf data.tar.* -C "$jpeg" && rm -rf "$tmp"); fi
done
lib="$jpeg/usr/lib/x86_64-linux-gnu"
[ -f "$jpeg/usr/include/jpeglib.h" ] && [ -e "$lib/libturbojpeg.so.0" ] || { echo "Error: the bundle's .debs did not give jpeglib.h and libturbojpeg.so.0 under $jpeg" >&2; exit 2; }
if [ "$(id -u)" = 0 ] && command -v ldconfig >/dev/null && [ -z "${NO_LDCONFIG:-}" ]; then
  echo "$lib" > /etc/ld.so.conf.d/shardkit-gpu-check.conf && ldconfig
fi
export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "2. libjpeg-turbo $(ls "$bundle"/debs | sed -n 's/.*_1%3a\([0-9.]*\)-.*/\1/p' | head -1) unpacked in $jpeg"
export CPATH="$jpeg/usr/include:$jpeg/usr/include/x86_64-linux-gnu${CPATH:+:$CPATH}"
export LIBRARY_PATH="$lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
"$py" setup.py -q build_ext --inplace -j "$(nproc)" > /tmp/gpu-check-build.log 2>&1 || { tail -20 /tmp/gpu-check-build.log; echo "Error: building the C extensions failed (log above)" >&2; exit 2; }
export PYTHONPATH="$PWD:$site${PYTHONPATH:+:$PYTHONPATH}"
"$py" -c "import sys; from shardkit.decode.extensions import main; sys.exit(main(['--require']))"
"$py" -c "import shardkit.augment._kernels, turbojpeg; turbojpeg.TurboJPEG(); print('3. C extensions built; PyTurboJPEG loads libturbojpeg')"
echo "   setup took $(( $(date +%s) - t0 )) s"
args=("$@")
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  case " ${args[*]-} " in *" --out "*) ;; *) args+=(--out "$OUT/gpu_check.json") ;; esac
fi
export PYTHONUNBUFFERED=1
rc=0
"$py" scripts/gpu_check.py ${args[@]+"${args[@]}"} || rc=$?
if [ -n "${OUT:-}" ]; then
  work=/tmp/shardkit-gpu-check
  case " ${args[*]} " in *" --dry-run "*) work=/tmp/shardkit-gpu-check-dry ;; esac
  for a in ${args[@]+"${args[@]}"}; do [ "${prev:-}" = --work ] && work="$a"; prev="$a"; done
  tar -czf "$OUT/gpu_check_logs.tar.gz" -C "$work" logs 2>/dev/null || true
fi
exit $rc
