#!/usr/bin/env bash
# C++ packaging, as a user of an installed pskv meets it: `cmake --install` of this
# build into a temporary prefix, then a project outside the tree (tests/consumer)
# built with find_package(pskv) and with pkg-config, run locally and under the
# installed pskv-launch (whose pskv-server must come from the prefix too).
# Usage: install_consumer.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
tmp=$(mktemp -d /tmp/pskv_install_XXXXXX)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

cmake --install "$build" --prefix "$prefix" >/dev/null
for f in include/pskv/kvstore.h bin/pskv-launch bin/pskv-server lib/cmake/pskv/pskvConfig.cmake \
         lib/cmake/pskv/pskvTargets.cmake lib/pkgconfig/pskv.pc; do
  [[ -e $prefix/$f ]] || { echo "FAIL: $f not installed"; exit 1; }
done
ls "$prefix"/lib/libpskv.so.* >/dev/null
[[ ! -e $prefix/include/pskv/../../src ]] || { echo "FAIL: private headers installed"; exit 1; }

# find_package(pskv): pskv::pskv (and pskv::torch when it was built).
check_torch=OFF
[[ -e $prefix/lib/cmake/pskv/pskvTorchTargets.cmake ]] && check_torch=ON
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
cmake -S "$src/tests/consumer" -B "$tmp/consumer" "${gen[@]}" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCONSUMER_CHECK_TORCH=$check_torch > "$tmp/configure.log" || { cat "$tmp/configure.log"; exit 1; }
grep -q "pskv 0\." "$tmp/configure.log"
if [[ $check_torch == ON ]]; then grep -q "pskv::torch found" "$tmp/configure.log"; fi
cmake --build "$tmp/consumer" >/dev/null
# The consumer uses the installed library, not the build tree's.
lib=$(ldd "$tmp/consumer/consumer" | awk '/libpskv.so/ {print $3}')
[[ $lib == "$prefix"/* ]] || { echo "FAIL: consumer loads libpskv from '$lib'"; exit 1; }
"$tmp/consumer/consumer" local

# pkg-config
PKG_CONFIG_PATH=$prefix/lib/pkgconfig pkg-config --exact-version="$(PKG_CONFIG_PATH=$prefix/lib/pkgconfig pkg-config --modversion pskv)" pskv
g++ -std=c++20 "$src/tests/consumer/main.cc" -o "$tmp/consumer_pc" \
  $(PKG_CONFIG_PATH=$prefix/lib/pkgconfig pkg-config --cflags --libs pskv)
"$tmp/consumer_pc" local

# The installed tools: pskv-launch finds the installed pskv-server next to it.
"$prefix/bin/pskv-launch" --version
env -u LD_LIBRARY_PATH DMLC_PS_ROOT_URI=127.0.0.1 "$prefix/bin/pskv-launch" -n 2 -s 1 --timeout 60 \
  --no-timestamps -- "$tmp/consumer/consumer" dist_sync > "$tmp/job.log" 2>&1 || { cat "$tmp/job.log"; exit 1; }
grep -q "consumer dist_sync rank 1: ok" "$tmp/job.log" || { cat "$tmp/job.log"; exit 1; }
# add_subdirectory(pskv): the libraries and tools, none of pskv's tests or benchmarks.
mkdir -p "$tmp/parent"
cat > "$tmp/parent/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.22)
project(parent LANGUAGES CXX)
add_subdirectory($src pskv)
add_executable(consumer $src/tests/consumer/main.cc)
target_link_libraries(consumer PRIVATE pskv::pskv)
CMAKE
cmake -S "$tmp/parent" -B "$tmp/parent/build" "${gen[@]}" -DPSKV_BUILD_TORCH=OFF > "$tmp/parent.log" 2>&1 ||
  { cat "$tmp/parent.log"; exit 1; }
# Every target of the configured tree has a CMakeFiles/<target>.dir.
targets=$(sed 's|.*/CMakeFiles/||; s|\.dir$||' "$tmp/parent/build/CMakeFiles/TargetDirectories.txt")
for t in consumer pskv pskv-launch pskv-server; do
  grep -qx -- "$t" <<<"$targets" || { echo "FAIL: target $t missing under add_subdirectory"; exit 1; }
done
for t in pskv_unit_tests pskv-bench kvstore_demo _pskv dist_worker; do
  if grep -qx -- "$t" <<<"$targets"; then echo "FAIL: add_subdirectory builds $t"; exit 1; fi
done
echo "install_consumer: ok"
