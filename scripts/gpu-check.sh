#!/usr/bin/env bash
# One-command GPU check: builds pskv with CUDA (PSKV_WITH_CUDA=ON) into its own build
# directory and runs the `gpu`-labelled tests, writing every result as JSON into one
# folder. Meant for a machine with a GPU and nvcc but no package registry.
#
# Usage: scripts/gpu-check.sh OUT_DIR [--debs DIR] [--build-dir DIR] [--jobs N] [--allow-skip]
#   OUT_DIR       results: gpu_tests.json (the device suites on the GPU), sim_control.json (the
#                 same binary on simulated devices), gpu_fake_devices.json, device_tests.json (GoogleTest
#                 JSON), ctest_gpu.xml (JUnit), build.log, summary.json
#   --debs DIR    unpack every DIR/*.deb into a local prefix (dpkg-deb -x, no root, no
#                 registry) and build against it; see "Packages" below
#   --build-dir   default: build-gpu-check (relative to the repository root)
#   --jobs N      build parallelism (default: nproc)
#   --allow-skip  exit 0 even when the GPU tests were skipped (a machine without a GPU);
#                 by default a skipped GPU test is a failure of the check (exit 2)
# Exit status: 0 all passed, 1 build or test failure, 2 GPU tests skipped.
#
# Packages. The check builds libpskv, pskv-launch, pskv-server and the test binaries
# (no torch, no Python). Beyond CUDA (nvcc and libcudart_static.a under /usr/local/cuda
# or on PATH) it needs these Debian 12 packages, a subset of scripts/install-deps.sh's
# list: cmake (cmake-data, libjsoncpp25, librhash0, libuv1), ninja-build (or make),
# g++, pkg-config, libzmq3-dev and libzmq5 with what libzmq.pc names (libsodium-dev,
# libsodium23, libpgm-dev, libpgm-5.3-0, libnorm-dev, libnorm1, libkrb5-dev,
# krb5-multidev, comerr-dev, libgssapi-krb5-2, libbsd-dev, libxml2-dev), libgtest-dev,
# libgmock-dev, zlib1g-dev, libcli11-dev. To bring them as .deb files, on a Debian 12
# machine with a registry:
#   mkdir debs && cd debs && apt-get download cmake cmake-data ninja-build pkg-config \
#     libzmq3-dev libzmq5 libsodium-dev libsodium23 libpgm-dev libpgm-5.3-0 libnorm-dev \
#     libnorm1 libkrb5-dev krb5-multidev comerr-dev libbsd-dev libxml2-dev libgtest-dev \
#     libgmock-dev zlib1g-dev libcli11-dev libjsoncpp25 librhash0 libuv1
# (or `apt-get install --download-only -o Dir::Cache::archives=$PWD ...` in a clean
# container for the full dependency closure). What is already installed on the GPU
# machine is used as is; the unpacked prefix only adds to it.
set -uo pipefail

usage() { sed -n '2,12p' "$0" >&2; exit 2; }
[[ $# -ge 1 ]] || usage
OUT=$1
shift
DEBS=""
BUILD=build-gpu-check
JOBS=$(nproc)
ALLOW_SKIP=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --debs) DEBS=$2; shift 2 ;;
    --build-dir) BUILD=$2; shift 2 ;;
    --jobs) JOBS=$2; shift 2 ;;
    --allow-skip) ALLOW_SKIP=1; shift ;;
    *) echo "gpu-check.sh: unknown option '$1'" >&2; usage ;;
  esac
done

ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$ROOT"
[[ "$BUILD" = /* ]] || BUILD="$ROOT/$BUILD"
log() { echo "gpu-check: $*" | tee -a "$OUT/build.log" >&2; }
: > "$OUT/build.log"

# ---- local prefix from .deb files (dpkg-deb -x needs no root and no registry)
if [[ -n "$DEBS" ]]; then
  PREFIX="$BUILD/deps-prefix"
  mkdir -p "$PREFIX"
  shopt -s nullglob
  debs=("$DEBS"/*.deb)
  [[ ${#debs[@]} -gt 0 ]] || { log "no .deb files in $DEBS"; exit 1; }
  for d in "${debs[@]}"; do
    dpkg-deb -x "$d" "$PREFIX" || { log "cannot unpack $d"; exit 1; }
  done
  log "unpacked ${#debs[@]} .deb files into $PREFIX"
  multiarch=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
  export PATH="$PREFIX/usr/bin:$PATH"
  export CMAKE_PREFIX_PATH="$PREFIX/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  export PKG_CONFIG_PATH="$PREFIX/usr/lib/$multiarch/pkgconfig:$PREFIX/usr/share/pkgconfig:$PREFIX/usr/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
  # The unpacked .pc files say prefix=/usr: point them at the prefix.
  find "$PREFIX" -name '*.pc' -exec sed -i "s|^prefix=/usr\$|prefix=$PREFIX/usr|" {} +
  export CPATH="$PREFIX/usr/include${CPATH:+:$CPATH}"
  export LIBRARY_PATH="$PREFIX/usr/lib/$multiarch${LIBRARY_PATH:+:$LIBRARY_PATH}"
  export LD_LIBRARY_PATH="$PREFIX/usr/lib/$multiarch:$PREFIX/lib/$multiarch${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # (an unpacked cmake finds its modules relative to its executable: ../share/cmake-*)
fi
if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
log "configuring $BUILD (PSKV_WITH_CUDA=ON)"
if ! cmake -S "$ROOT" -B "$BUILD" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DPSKV_WITH_CUDA=ON -DPSKV_BUILD_TORCH=OFF -DPSKV_BUILD_PYTHON=OFF -DPSKV_BUILD_BENCH=OFF \
    >>"$OUT/build.log" 2>&1; then
  log "configure failed (see build.log)"
  exit 1
fi
log "building the GPU and device tests with $JOBS jobs"
start=$(date +%s)
if ! cmake --build "$BUILD" -j "$JOBS" --target pskv_gpu_tests pskv_device_tests pskv_device_runtime_tests \
    >>"$OUT/build.log" 2>&1; then
  log "build failed (see build.log)"
  exit 1
fi
build_s=$(( $(date +%s) - start ))

gpu_status=$("$BUILD/tests/pskv_gpu_tests" --gtest_list_tests >/dev/null 2>&1 && echo ok || echo broken)
rc=0
run_gtest() {  # name binary [env...] -- args
  local name=$1 bin=$2
  shift 2
  env "$@" "$bin" --gtest_output="json:$OUT/$name.json" >"$OUT/$name.log" 2>&1 || rc=1
}
# The device suites on the GPU, then (control) on the simulator: the same binary.
run_gtest gpu_tests "$BUILD/tests/pskv_device_runtime_tests" PSKV_SIM_DEVICES=
run_gtest sim_control "$BUILD/tests/pskv_device_runtime_tests" PSKV_SIM_DEVICES=3
run_gtest gpu_fake_devices "$BUILD/tests/pskv_gpu_tests" PSKV_CUDA_FAKE_DEVICES=3 \
  --gtest_filter='GpuFakeDevices.*'
run_gtest device_tests "$BUILD/tests/pskv_device_tests"
(cd "$BUILD" && ctest -L gpu --timeout 600 --output-junit "$OUT/ctest_gpu.xml" \
   >"$OUT/ctest_gpu.log" 2>&1) || rc=1

# Counts from the GoogleTest JSON files (plain grep: no python needed).
# The first "tests"/"failures" of each file is the file's total.
count() {
  local f
  for f in "$OUT"/gpu_tests.json "$OUT"/gpu_fake_devices.json "$OUT"/device_tests.json \
           "$OUT"/sim_control.json; do
    grep -o -m1 "\"$1\": *[0-9]*" "$f" 2>/dev/null | head -1
  done | awk -F: '{s+=$2} END {print s+0}'
}
tests=$(count tests)
failures=$(count failures)
skipped=$(grep -ho '"result": *"SKIPPED"' "$OUT"/gpu_tests.json "$OUT"/gpu_fake_devices.json \
            2>/dev/null | wc -l)
smi=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null \
        | head -1 | tr -d '"')
reason=$(grep -h -A1 "Skipped" "$OUT/gpu_tests.log" 2>/dev/null | grep -v Skipped | head -1 | tr -d '"\\')
commit=$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)
cat >"$OUT/summary.json" <<JSON
{
  "commit": "$commit",
  "date": "$(date -u +%FT%TZ)",
  "host": "$(hostname)",
  "nvidia_smi": "${smi:-none}",
  "nvcc": "$(nvcc --version 2>/dev/null | tail -2 | head -1 | tr -d '"')",
  "build_seconds": $build_s,
  "gpu_test_binary": "$gpu_status",
  "tests": $tests,
  "failures": $failures,
  "gpu_tests_skipped": $skipped,
  "skip_reason": "${reason}",
  "status": $rc
}
JSON
log "results in $OUT (tests $tests, failures $failures, GPU tests skipped $skipped)"
if [[ $rc -ne 0 ]]; then exit 1; fi
if [[ $skipped -gt 0 && $ALLOW_SKIP -eq 0 ]]; then
  log "GPU tests were skipped: ${reason:-see gpu_tests.log}"
  exit 2
fi
exit 0
