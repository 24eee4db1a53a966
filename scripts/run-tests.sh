#!/usr/bin/env bash
# Runs the whole CTest suite in BUILD_DIR with JOBS in parallel, as `make test` does.
#
# The suite starts hundreds of real processes (schedulers, servers, workers, attackers)
# on two cores; a few multi-process tests have time bounds that a fully loaded machine
# can exceed. A test that fails is therefore run once more, alone: it fails `make test`
# only if it fails again. A test that passes alone is reported as LOAD-SENSITIVE at the
# end (and listed in $BUILD_DIR/load-sensitive-tests.txt): each such line is a defect to
# look at (docs/design.md, "tests/"), never to silence. PSKV_TEST_NO_RERUN=1 turns the rerun off.
#
#   scripts/run-tests.sh BUILD_DIR JOBS [extra ctest arguments]
set -uo pipefail
# Last: which commit's CUDA layer last ran on a real GPU, and a warning when the CUDA
# backend or the kernels changed since (docs/gpu-ledger.json, scripts/gpu-ledger.py).
root=$(cd "$(dirname "$0")/.." && pwd)
trap 'echo; /usr/bin/env python3 "$root/scripts/gpu-ledger.py" status --ledger "$root/docs/gpu-ledger.json" --repo "$root" || true' EXIT
build=${1:?usage: run-tests.sh BUILD_DIR JOBS [ctest args]}
jobs=${2:?usage: run-tests.sh BUILD_DIR JOBS [ctest args]}
shift 2
cd "$build" || exit 2
rm -f load-sensitive-tests.txt

ctest --output-on-failure -j "$jobs" --timeout 300 "$@"
rc=$?
[ $rc -eq 0 ] && exit 0

failed=Testing/Temporary/LastTestsFailed.log
if [ ! -s "$failed" ] || [ "${PSKV_TEST_NO_RERUN:-0}" = 1 ]; then
  echo "make test: FAILED (ctest exit $rc)"
  exit $rc
fi
cp "$failed" first-failures.txt
echo
echo "== make test: $(wc -l < first-failures.txt) test(s) failed under the parallel run; each runs once more, alone =="
ctest --output-on-failure -j 1 --timeout 300 --rerun-failed "$@"
rerun=$?
echo
echo "== make test: summary =="
if [ $rerun -ne 0 ]; then
  echo "FAILED (also when run alone):"
  sed 's/^/  /' "$failed"
  exit $rerun
fi
cut -d: -f2- first-failures.txt > load-sensitive-tests.txt
echo "All tests passed. LOAD-SENSITIVE (failed beside other tests, passed alone):"
sed 's/^/  /' load-sensitive-tests.txt
exit 0
