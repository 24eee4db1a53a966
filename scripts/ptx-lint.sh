#!/usr/bin/env bash
# PTX lint of pskv's kernels (no GPU needed): nvcc compiles src/device/cuda/kernels.cu to
# PTX for each architecture pskv ships, and the check fails on any `fma` instruction and
# on any float add/sub/mul without an explicit rounding modifier (`.rn`): PTX lets the
# optimizer contract unrounded mul/add pairs into fused multiply-adds, which would make a
# GPU result differ from the CPU's (device/kernel_ops.h; the build passes --fmad=false).
#   scripts/ptx-lint.sh [NVCC]     exit 0: clean; 1: a finding; 77: no nvcc (skipped)
set -euo pipefail
cd "$(dirname "$0")/.."
nvcc=${1:-${CUDACXX:-}}
[[ -z "$nvcc" ]] && nvcc=$(command -v nvcc || true)
[[ -z "$nvcc" && -x /usr/local/cuda/bin/nvcc ]] && nvcc=/usr/local/cuda/bin/nvcc
if [[ -z "$nvcc" ]]; then
  echo "ptx-lint: SKIPPED (no nvcc)"
  exit 77
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
status=0
for arch in sm_80 sm_90; do
  "$nvcc" -std=c++17 -ptx -arch=$arch --fmad=false -I include -I src \
    src/device/cuda/kernels.cu -o "$out/k_$arch.ptx"
  entries=$(grep -cE '\.entry ' "$out/k_$arch.ptx" || true)
  fma=$(grep -cE '\bfma\.' "$out/k_$arch.ptx" || true)
  # Unrounded add/sub/mul may be contracted; approximate division or square root is not IEEE.
  unrounded=$(grep -cE '\b(add|sub|mul)\.f(32|64)\b|\b(div|sqrt)\.(approx|full)\.' "$out/k_$arch.ptx" || true)
  rounded=$(grep -cE '\b(add|sub|mul)\.rn\.f(32|64)\b' "$out/k_$arch.ptx" || true)
  echo "ptx-lint $arch: $entries kernels, $rounded rounded add/sub/mul, $fma fma, $unrounded unrounded"
  if [[ "$entries" -eq 0 || "$fma" -ne 0 || "$unrounded" -ne 0 ]]; then
    grep -nE '\bfma\.|\b(add|sub|mul)\.f(32|64)\b|\b(div|sqrt)\.(approx|full)\.' "$out/k_$arch.ptx" | head -5
    status=1
  fi
done
exit $status
