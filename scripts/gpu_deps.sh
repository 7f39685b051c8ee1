#!/usr/bin/env bash
# Fetches, on a machine with network and apt, what scripts/gpu_check.sh needs
# but a bare GPU machine lacks: Catch2 v2 (header-only, Debian's `catch2`
# package) for the MoE LibTorch tests, unpacked into .gpu-deps/; and, for the
# whole moerl that scripts/gpu_job_check.sh builds there, the Debian packages
# of the libraries the GPU machine's image was seen without (Ubuntu 24.04
# with MPI, HDF5, spdlog, CLI11 and nlohmann-json, on 4 Dec 2026): toml++,
# cpp-httplib and brotli, ISA-L, PCRE2 and ICU, kept as .deb files in
# .gpu-deps/debs (unpacked on the GPU machine). All ignored by git, about
# 26 MB, which the device run carries: carry [".gpu-deps"].
# Usage: scripts/gpu_deps.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="$ROOT/.gpu-deps"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
chmod 777 "$TMP"   # apt downloads as the _apt user where it can

(cd "$TMP" && apt-get download catch2)
deb="$(ls "$TMP"/catch2_*.deb)"
version="$(dpkg-deb -f "$deb" Version)"
# tests/ use Catch2 v2's single header <catch2/catch.hpp>; v3 has none.
if [[ "$version" != 2.* ]]; then
  echo "gpu_deps: apt offers catch2 $version; the tests need Catch2 v2" >&2
  exit 1
fi

rm -rf "$DEST"
mkdir -p "$DEST"
dpkg -x "$deb" "$DEST"
rm -rf "$DEST/usr/share/doc"
# gpu_check.sh points CMAKE_PREFIX_PATH at $DEST/usr, where CMake finds these.
test -f "$DEST/usr/lib/cmake/Catch2/Catch2Config.cmake"
test -f "$DEST/usr/include/catch2/catch.hpp"
# The whole build's libraries: development packages and their runtime libraries.
mkdir -p "$DEST/debs"
(cd "$DEST/debs" && apt-get download libtomlplusplus-dev libtomlplusplus3 libcpp-httplib-dev libcpp-httplib0.11 \
  libbrotli-dev libbrotli1 libisal-dev libisal2 libpcre2-dev libpcre2-8-0 libicu-dev libicu72)
echo "gpu_deps: catch2 $version in $DEST ($(du -sh "$DEST" | cut -f1)); carry \".gpu-deps\""
