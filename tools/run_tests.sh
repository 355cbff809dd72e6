#!/usr/bin/env bash
# Builds momfmm twice (Release, and Sanitize = AddressSanitizer + UBSan) and
# runs the CTest suites: everything in Release; the unit and end-to-end
# tests again under the sanitizers. Extra arguments go to both ctest runs.
set -uo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
status=0
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build build -j"$jobs" || exit 1
ctest --test-dir build --output-on-failure -j"$jobs" "$@" || status=1
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Sanitize >/dev/null && cmake --build build-asan -j"$jobs" || exit 1
ctest --test-dir build-asan --output-on-failure -j"$jobs" -L "unit|sanitize" "$@" || status=1
exit $status
