#!/usr/bin/env bash
# Configures and builds moerl into build/ (or $MOERL_BUILD_DIR). Extra
# arguments are passed to `cmake --build` (e.g. --target moerl).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${MOERL_BUILD_DIR:-build}"
GENERATOR=()
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ] && command -v ninja >/dev/null; then GENERATOR=(-G Ninja); fi
cmake -S . -B "$BUILD_DIR" "${GENERATOR[@]}" -DCMAKE_BUILD_TYPE="${MOERL_BUILD_TYPE:-Release}" \
  ${MOERL_CMAKE_ARGS:-} >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)" "$@"
