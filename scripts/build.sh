#!/usr/bin/env bash
# Configures and builds ckptsim into ./build (Release, Ninja, ccache when present).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${CKPTSIM_BUILD_DIR:-build}"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build_dir" "$@"
