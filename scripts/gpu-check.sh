#!/usr/bin/env bash
# One-command GPU check (docs/gpu.md, "Running the GPU check"): builds pskv with CUDA for the
# GPU at hand only (its compute capability from nvidia-smi, e.g. 90-real on an H200) into its
# own build directory, then
#   1. runs the device suite (pskv_device_runtime_tests) on the real GPU and on the simulator,
#      each test writing its result checksums and copy counters (PSKV_TEST_RESULTS_JSON), and
#      compares them bit for bit and byte for byte (scripts/gpu-compare.py); the same again
#      with 3 logical devices (PSKV_CUDA_FAKE_DEVICES=3) against 3 logical devices on one
#      simulated device;
#   2. runs compute-sanitizer (memcheck) over the suite where it is installed;
#   3. runs the GPU benchmarks (pskv-bench device: k-way sum vs d2d copy, staging vs pinned
#      memcpy, each against its ceiling measured in the same run);
#   4. appends an entry to the ledger docs/gpu-ledger.json (scripts/gpu-ledger.py: commit,
#      GPU, driver, tests run/passed, comparisons, figures): commit it. `make test` prints
#      which commit's CUDA layer last ran on a GPU and warns when it changed since.
# Without a GPU every GPU step says SKIPPED (the simulator runs and the benchmarks run on
# simulated devices, figures not recorded) and no ledger entry is written.
#
# Usage: scripts/gpu-check.sh OUT_DIR [--debs DIR] [--build-dir DIR] [--jobs N] [--allow-skip]
#                                     [--ledger FILE]
#   OUT_DIR       results: summary.json, results_{gpu,sim,gpu_fake,sim_fake}.json (per-test
#                 checksums and counters), compare_*.json, *.json (GoogleTest JSON) and *.log
#                 per run, sanitizer.log, bench_device.json, build.log
#   --debs DIR    unpack every DIR/*.deb into a local prefix (dpkg-deb -x, no root, no
#                 registry) and build against it; see "Packages" below
#   --build-dir   default: build-gpu-check (relative to the repository root)
#   --jobs N      build parallelism (default: nproc)
#   --allow-skip  exit 0 even when the GPU tests were skipped (a machine without a GPU);
#                 by default a check without a GPU is a failure of the check (exit 2)
#   --ledger F    the ledger to append to (default: docs/gpu-ledger.json)
# Exit status: 0 all passed, 1 build or test failure or a sim/GPU difference, 2 GPU tests
# skipped. Needs python3 (comparison and ledger) besides the build dependencies.
#
# Packages. The check builds libpskv, pskv-bench and the device test binaries (no torch,
# no Python bindings; python3 runs the comparison and the ledger). Beyond CUDA (nvcc and
# libcudart_static.a under /usr/local/cuda or on PATH) it needs these Debian 12
# packages, a subset of scripts/install-deps.sh's list: cmake (cmake-data, libjsoncpp25, librhash0, libuv1), ninja-build (or make),
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

usage() { sed -n '2,34p' "$0" >&2; exit 2; }
[[ $# -ge 1 ]] || usage
OUT=$1
shift
DEBS=""
BUILD=build-gpu-check
JOBS=$(nproc)
ALLOW_SKIP=0
LEDGER=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --debs) DEBS=$2; shift 2 ;;
    --build-dir) BUILD=$2; shift 2 ;;
    --jobs) JOBS=$2; shift 2 ;;
    --allow-skip) ALLOW_SKIP=1; shift ;;
    --ledger) LEDGER=$2; shift 2 ;;
    *) echo "gpu-check.sh: unknown option '$1'" >&2; usage ;;
  esac
done

ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
[[ -z "$LEDGER" || "$LEDGER" = /* ]] || LEDGER="$PWD/$LEDGER"
[[ -n "$LEDGER" ]] || LEDGER="$ROOT/docs/gpu-ledger.json"
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

# ---- the GPU at hand: build for its compute capability only
GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
GPUS=${GPUS:-0}
arch_args=()
gpu_name="none" driver="none" caps="none"
if [[ $GPUS -gt 0 ]]; then
  gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr -d '"')
  driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1 | tr -d '"')
  caps=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | tr -d ' .' | sort -u \
           | sed 's/$/-real/' | paste -sd ';' -)
  arch_args=(-DCMAKE_CUDA_ARCHITECTURES="$caps")
  log "$GPUS GPU(s): $gpu_name, driver $driver; building for CUDA architectures $caps only"
else
  log "no GPU (nvidia-smi lists none): building for the default architectures; every GPU step is SKIPPED"
fi

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
log "configuring $BUILD (PSKV_WITH_CUDA=ON)"
if ! cmake -S "$ROOT" -B "$BUILD" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DPSKV_WITH_CUDA=ON -DPSKV_BUILD_TORCH=OFF -DPSKV_BUILD_PYTHON=OFF -DPSKV_BUILD_BENCH=ON \
    "${arch_args[@]}" >>"$OUT/build.log" 2>&1; then
  log "configure failed (see build.log)"
  exit 1
fi
log "building the device tests and pskv-bench with $JOBS jobs"
start=$(date +%s)
if ! cmake --build "$BUILD" -j "$JOBS" --target pskv_device_runtime_tests pskv_device_tests pskv-bench \
    >>"$OUT/build.log" 2>&1; then
  log "build failed (see build.log)"
  exit 1
fi
build_s=$(( $(date +%s) - start ))
log "built in ${build_s}s"

rc=0
SUITE="$BUILD/tests/pskv_device_runtime_tests"
run_gtest() {  # name binary timeout_s [VAR=value...] [-- gtest args]
  local name=$1 bin=$2 limit=$3
  shift 3
  local envs=() args=()
  while [[ $# -gt 0 && "$1" != "--" ]]; do envs+=("$1"); shift; done
  [[ $# -gt 0 ]] && { shift; args=("$@"); }
  timeout "$limit" env "${envs[@]}" "$bin" --gtest_output="json:$OUT/$name.json" "${args[@]}" \
    >"$OUT/$name.log" 2>&1
  local r=$?
  [[ $r -eq 124 ]] && log "$name: timed out after ${limit}s"
  [[ $r -ne 0 ]] && { rc=1; log "$name: FAILED (see $name.log)"; }
  return 0
}
# The suite on the real GPU(s) and on as many simulated devices; then 3 logical devices on
# GPU 0 against 3 logical devices on one simulated device. Each run writes per-test
# checksums and counters. (Without a GPU the GPU runs report every test SKIPPED; the
# SimDevices tests are about simulated devices and skip on a GPU, and with logical devices.)
SIMN=$GPUS
[[ $SIMN -gt 0 ]] || SIMN=3
run_gtest gpu "$SUITE" 300 PSKV_SIM_DEVICES= PSKV_CUDA_FAKE_DEVICES= \
  PSKV_TEST_RESULTS_JSON="$OUT/results_gpu.json"
run_gtest sim "$SUITE" 300 PSKV_SIM_DEVICES=$SIMN PSKV_CUDA_FAKE_DEVICES= \
  PSKV_TEST_RESULTS_JSON="$OUT/results_sim.json"
run_gtest gpu_fake "$SUITE" 300 PSKV_SIM_DEVICES= PSKV_CUDA_FAKE_DEVICES=3 \
  PSKV_TEST_RESULTS_JSON="$OUT/results_gpu_fake.json" -- --gtest_filter='-SimDevices.*'
run_gtest sim_fake "$SUITE" 300 PSKV_SIM_DEVICES=1 PSKV_CUDA_FAKE_DEVICES=3 \
  PSKV_TEST_RESULTS_JSON="$OUT/results_sim_fake.json" -- --gtest_filter='-SimDevices.*'
run_gtest device_tests "$BUILD/tests/pskv_device_tests" 120

# Counts from the GoogleTest JSON files (plain grep). The first "tests"/"failures" of
# each file is the file's total.
first() { grep -o -m1 "\"$1\": *[0-9]*" "$2" 2>/dev/null | head -1 | awk -F: '{print $2+0}'; }
tests=0 failures=0 skipped=0 gpu_ran=0
for n in gpu sim gpu_fake sim_fake device_tests; do
  f="$OUT/$n.json"
  t=$(first tests "$f"); fl=$(first failures "$f")
  sk=$(grep -o '"result": *"SKIPPED"' "$f" 2>/dev/null | wc -l)
  tests=$((tests + ${t:-0})); failures=$((failures + ${fl:-0})); skipped=$((skipped + sk))
  # A GPU run ran on a GPU only if it found a device (tests that need none pass anyway).
  if [[ $n = gpu || $n = gpu_fake ]] && [[ $GPUS -gt 0 ]] &&
     grep -q '"devices": *[1-9]' "$OUT/results_$n.json" 2>/dev/null; then
    gpu_ran=$((gpu_ran + ${t:-0} - sk))
  fi
done
reason=$(grep -h -A1 "Skipped" "$OUT/gpu.log" 2>/dev/null | grep -v Skipped | head -1 | tr -d '"\\')
if [[ $GPUS -gt 0 && $gpu_ran -eq 0 ]]; then
  log "nvidia-smi lists $GPUS GPU(s) but every GPU test was skipped: ${reason:-see gpu.log}"
fi

# ---- simulator vs GPU, bit for bit and byte for byte
compare="SKIPPED"
if [[ $gpu_ran -gt 0 ]]; then
  compare="passed"
  for pair in ":runtime" "_fake:fake_devices"; do
    sfx=${pair%%:*} name=${pair#*:}
    python3 "$ROOT/scripts/gpu-compare.py" "$OUT/results_sim$sfx.json" "$OUT/results_gpu$sfx.json" \
      --name "$name" --out "$OUT/compare_$name.json" 2>&1 | tee -a "$OUT/build.log" | tail -1 >&2
    [[ ${PIPESTATUS[0]} -eq 0 ]] || { rc=1; compare="FAILED"; }
  done
else
  log "SKIPPED simulator vs GPU comparison: the GPU tests did not run (${reason:-no GPU})"
fi

# ---- compute-sanitizer (memcheck) over the suite on 3 logical devices
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
sanitizer="SKIPPED (no GPU)"
if [[ $gpu_ran -gt 0 && -z "$SAN" ]]; then
  sanitizer="SKIPPED (compute-sanitizer not installed)"
elif [[ $gpu_ran -gt 0 ]]; then
  # The big-size sum sweep is left out (slow under memcheck; the same kernels run in the
  # other tests), and the death tests (they fork).
  if timeout 240 env PSKV_SIM_DEVICES= PSKV_CUDA_FAKE_DEVICES=3 "$SAN" --tool memcheck \
      --error-exitcode 3 --log-file "$OUT/sanitizer.log" "$SUITE" \
      --gtest_filter='-Gpu.SumIsBitExactWithTheCpuReducer:GpuLazyInit.*' >"$OUT/sanitizer_run.log" 2>&1; then
    sanitizer="passed"
  else
    sanitizer="FAILED"; rc=1
  fi
fi
log "compute-sanitizer: $sanitizer"

# ---- the GPU benchmarks (on simulated devices without a GPU: proves they run, no figures)
bench="SKIPPED"
if [[ $gpu_ran -gt 0 ]]; then
  if timeout 180 env PSKV_SIM_DEVICES= "$BUILD/pskv-bench" device --json >"$OUT/bench_device.json" \
      2>"$OUT/bench_device.log"; then bench="ran"; else bench="FAILED"; rc=1; fi
else
  if timeout 120 env PSKV_SIM_DEVICES=2 "$BUILD/pskv-bench" device --json --quick \
      >"$OUT/bench_device_simulated.json" 2>"$OUT/bench_device.log"; then
    bench="SKIPPED on a GPU (ran on simulated devices: bench_device_simulated.json, figures meaningless)"
  else
    bench="FAILED on simulated devices"; rc=1
  fi
fi
log "benchmarks: $bench"

commit=$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)
dirty=false
git -C "$ROOT" diff --quiet HEAD -- 2>/dev/null || dirty=true
cat >"$OUT/summary.json" <<JSON
{
  "commit": "$commit",
  "uncommitted_changes": $dirty,
  "date": "$(date -u +%FT%TZ)",
  "host": "$(hostname)",
  "gpu": "$gpu_name",
  "gpus": $GPUS,
  "driver": "$driver",
  "compute_capability": "$caps",
  "nvcc": "$(nvcc --version 2>/dev/null | tail -2 | head -1 | tr -d '"')",
  "build_seconds": $build_s,
  "tests": $tests,
  "failures": $failures,
  "skipped": $skipped,
  "gpu_tests_ran": $gpu_ran,
  "skip_reason": "${reason}",
  "sim_vs_gpu": "$compare",
  "compute_sanitizer": "$sanitizer",
  "benchmarks": "$bench",
  "status": $rc
}
JSON
if [[ $gpu_ran -gt 0 ]]; then
  python3 "$ROOT/scripts/gpu-ledger.py" record --ledger "$LEDGER" --out-dir "$OUT" 2>&1 \
    | tee -a "$OUT/build.log" >&2
  log "commit the ledger ($LEDGER) with the check's results"
else
  log "no ledger entry: the GPU tests were SKIPPED (${reason:-no GPU})"
fi
log "results in $OUT: tests $tests, failures $failures, skipped $skipped, run on a GPU $gpu_ran"
if [[ $rc -ne 0 ]]; then exit 1; fi
if [[ $gpu_ran -eq 0 ]]; then
  log "SKIPPED: no GPU test ran${reason:+: $reason}"
  [[ $ALLOW_SKIP -eq 1 ]] && exit 0
  exit 2
fi
exit 0
