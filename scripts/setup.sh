#!/usr/bin/env bash
# Installs what ckptsim needs from Debian 12's packages, only if something is missing
# (with --fuzz, also what the fuzz build needs).
# Run as root (or with sudo available). Nothing is downloaded from anywhere but Debian.
set -euo pipefail

packages=(
  # build tools, and the checks of scripts/tidy.sh
  g++ cmake ninja-build ccache pkg-config clang-format clang-tidy
  # libraries (Debian 12 packages only; see README "Dependencies")
  libtorch-dev libgloo-dev librapidcheck-dev libgtest-dev libgmock-dev libeigen3-dev libfmt-dev
  libbenchmark-dev nlohmann-json3-dev libcli11-dev zlib1g-dev libtcmalloc-minimal4
  # the replay runner's torch-free tests (tests/replay)
  python3 python3-pytest
  # `ckptsim plot` and the pictures of scripts/main.sh: gnuplot's pngcairo, and the font the
  # pictures name (report/plot.cpp)
  gnuplot-nox fonts-dejavu-core
)

# With --fuzz (scripts/fuzz.sh), also clang 14 with libFuzzer and the sanitizer runtimes.
if [ "${1:-}" = "--fuzz" ]; then
  packages+=(clang-14 libclang-rt-14-dev)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ "${#missing[@]}" -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

echo "setup: installing ${missing[*]}"
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -q
"${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
