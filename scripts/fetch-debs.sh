#!/usr/bin/env bash
# Downloads (does not install) the Debian packages that scripts/gpu-runner.sh unpacks on a GPU
# machine without package-manager access, into .debs/ (or $CKPTSIM_DEBS). Run it here, on the
# Debian 12 development machine; the directory is git-ignored and travels with the device
# tool's `carry`. About 3.3 MB in all.
#
# The packages: headers and CMake files for Eigen, fmt (+ libfmt9, which fmt's CMake targets
# file requires to exist even for fmt::fmt-header-only), nlohmann-json, CLI11, RapidCheck
# (static), tcmalloc-minimal (the executables' malloc), GoogleTest and GMock
# (libgtest-dev/libgmock-dev ship libgtest.a, libgmock.a and their _main libraries, so nothing
# is built from source), Google Benchmark (+ its shared library libbenchmark1debian). Not libtorch: the GPU machine's PyTorch
# provides it.
set -euo pipefail
cd "$(dirname "$0")/.."
dest="${CKPTSIM_DEBS:-.debs}"
packages=(
  libeigen3-dev
  libfmt-dev libfmt9
  nlohmann-json3-dev
  libcli11-dev
  librapidcheck-dev
  libgtest-dev libgmock-dev
  libbenchmark-dev libbenchmark1debian
  zlib1g-dev
  libtcmalloc-minimal4
)
mkdir -p "$dest"
rm -f "$dest"/*.deb
# apt-get download needs package lists; fetch them once if this machine has none yet.
if ! (cd "$dest" && apt-get download "${packages[@]}"); then
  echo "fetch-debs: apt-get download failed; updating the package lists and retrying" >&2
  apt-get update -q
  (cd "$dest" && apt-get download "${packages[@]}")
fi
# Exactly one file per package, or the runner would unpack two versions over each other.
for p in "${packages[@]}"; do
  n=$(ls "$dest"/"${p}"_*.deb 2>/dev/null | wc -l)
  [ "$n" = 1 ] || { echo "fetch-debs: expected one .deb of $p, found $n" >&2; exit 1; }
done
ls -l "$dest"
du -sh "$dest"
