#!/usr/bin/env bash
# The test command: set up, build, run every test (unit, LibTorch, multi-rank,
# CLI). Exit status 0 only when all pass.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
scripts/setup.sh
scripts/build.sh
built=$(date +%s)
# Multi-rank tests run as root in CI containers; Open MPI refuses that unless told.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ctest --test-dir "${MOERL_BUILD_DIR:-build}" --output-on-failure -j "$(nproc)" "$@"
echo "test.sh: build $((built - start)) s, tests $(( $(date +%s) - built )) s"
