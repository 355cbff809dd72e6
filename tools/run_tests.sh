#!/usr/bin/env bash
# Builds momfmm twice (Release, and Sanitize = AddressSanitizer + UBSan) and
# runs the CTest suites: everything in Release; the unit and end-to-end
# tests again under the sanitizers.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs" "$@"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Sanitize >/dev/null
cmake --build build-asan -j"$jobs"
ctest --test-dir build-asan --output-on-failure -j"$jobs" -L "unit|sanitize" "$@"
