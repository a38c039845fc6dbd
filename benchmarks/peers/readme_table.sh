#!/usr/bin/env bash
# The runs behind README.md's benchmark table, back to back:
#   benchmarks/peers/readme_table.sh [SRC] [OUT.jsonl]
# SRC: an ImageFolder (default ../shared/data/flowers; examples/flowers-sample works anywhere).
# FFCV rows run only when $FFCV_PY (default /tmp/ffcv-venv/bin/python, see make_venv.sh) exists.
# WORKERS and EPOCHS (default 2 and 2) are passed on. Run it on a quiet machine.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
src="${1:-$root/../shared/data/flowers}"
out="${2:-$root/bench-results/peers.jsonl}"
ffcv_py="${FFCV_PY:-/tmp/ffcv-venv/bin/python}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$(dirname "$out")"
export WORKERS="${WORKERS:-2}" EPOCHS="${EPOCHS:-2}"
if [ -x "$ffcv_py" ]; then
  for mode in jpg raw; do
    MODE=$mode "$ffcv_py" "$here/peer_ffcv.py" "$src" "$work/ffcv" --out "$out"
  done
else
  echo "note: no FFCV venv at $ffcv_py (benchmarks/peers/make_venv.sh ffcv); FFCV rows skipped"
fi
"$root/.venv/bin/python" "$here/peerbench.py" "$src" "$work/peers" imagefolder_pil_uint8 \
  imagefolder_pil webdataset_pil shardkit --out "$out"
echo "results appended to $out"
