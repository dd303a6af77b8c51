#!/usr/bin/env bash
# Runs ckptsim's real engine (check --real, gate --real: app/real_engine.h) on a GPU machine that
# has PyTorch but no package manager (the lent H200, a self-hosted runner):
#   1. builds `ckptsim` against this machine's PyTorch libtorch (CUDA off: the model's own
#      arithmetic needs no GPU, and no libtorch_cuda is loaded) with the Debian packages of
#      scripts/fetch-debs.sh unpacked into a prefix, into $CKPTSIM_REAL_BUILD (default
#      build-real/, git-ignored: a warm machine keeps it between calls, and a second call
#      rebuilds only what changed);
#   2. applies each patch named by --patch LABEL=BASE:PATCH (a PR's diff, e.g. from
#      .megatron/patches/) to a copy of the checkout BASE, as the checkout LABEL next to it
#      (the copy is made once);
#   3. runs each COMMAND given after `--` with `ckptsim` on PATH as that build, CKPTSIM_PYTHON the
#      PyTorch interpreter, several at once with --parallel N, each one's output in
#      $OUT/<index>.log, and packs every --out directory they name into $OUT/real.tgz.
#
#   scripts/real-device.sh [--patch LABEL=BASE:PATCH]... [--parallel N] -- 'COMMAND' ['COMMAND'...]
#
# Needs: cmake, ninja, g++, .debs/ (scripts/fetch-debs.sh), PyTorch in $PYTHON (default
# /opt/torch/.venv/bin/python). Exit 0 when the build worked; each command's exit status is in
# its log and in $OUT/summary.txt (a gate that finds a new failure exits 1: that is a verdict).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out="${OUT:-out-real}"
mkdir -p "$out"
python="${PYTHON:-/opt/torch/.venv/bin/python}"
[ -x "$python" ] || python=python3
build="${CKPTSIM_REAL_BUILD:-$root/build-real}"
parallel=1
patches=()
while [ $# -gt 0 ]; do
  case "$1" in
    --patch) patches+=("$2"); shift 2;;
    --parallel) parallel=$2; shift 2;;
    --) shift; break;;
    -h|--help) sed -n '2,20p' "$0"; exit 0;;
    *) echo "real-device: unknown argument $1" >&2; exit 2;;
  esac
done
say() { echo "real-device: $*" | tee -a "$out/summary.txt"; }
t0=$(date +%s)

if [ ! -f "$build/CMakeCache.txt" ]; then
  prefix=/tmp/ckptsim-deps
  rm -rf "$prefix" && mkdir -p "$prefix"
  for f in "${CKPTSIM_DEBS:-.debs}"/*.deb; do
    if command -v dpkg-deb >/dev/null; then dpkg-deb -x "$f" "$prefix"
    else (tmp=$(mktemp -d) && cd "$tmp" && ar x "$root/$f" && tar -xf data.tar.* -C "$prefix"); fi
  done
  torch_prefix="$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)')" ||
    { say "no PyTorch in $python"; exit 1; }
  export CMAKE_POLICY_VERSION_MINIMUM=3.5
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCKPTSIM_CUDA=OFF \
    -DCKPTSIM_FMT_HEADER_ONLY=ON -DCKPTSIM_BUILD_TESTS=OFF -DCKPTSIM_BUILD_BENCH=OFF \
    "-DCMAKE_PREFIX_PATH=$prefix/usr;$torch_prefix" > "$out/build.log" 2>&1 ||
    { say "configuring failed:"; tail -30 "$out/build.log"; exit 1; }
fi
# Incremental: a warm machine rebuilds only what changed since its last call.
cmake --build "$build" --target ckptsim -- -j"$(nproc)" >> "$out/build.log" 2>&1 ||
  { say "building ckptsim failed:"; tail -30 "$out/build.log"; exit 1; }
say "ckptsim built in $(( $(date +%s) - t0 )) s"

for spec in "${patches[@]}"; do
  label=${spec%%=*}
  rest=${spec#*=}
  base=${rest%%:*}
  patch_file=${rest#*:}
  dest="$(dirname "$base")/$label"
  if [ ! -d "$dest" ]; then
    cp -r "$base" "$dest" && rm -f "$dest/CKPTSIM_UPSTREAM.json" &&
      (cd "$dest" && patch -p1 -s < "$root/$patch_file") ||
      { say "patch $patch_file on $base failed"; rm -rf "$dest"; exit 1; }
    say "$dest = $base + $patch_file"
  fi
done

export PATH="$build:$PATH"
export CKPTSIM_PYTHON="$python"
export CKPTSIM_REPLAY_DIR="$root"
i=0
pids=()
for cmd in "$@"; do
  i=$((i + 1))
  (
    s=$(date +%s)
    echo "\$ $cmd" > "$out/$i.log"
    bash -c "$cmd" >> "$out/$i.log" 2>&1
    rc=$?
    say "command $i exit $rc in $(( $(date +%s) - s )) s: $cmd"
  ) &
  pids+=($!)
  while [ "$(jobs -rp | wc -l)" -ge "$parallel" ]; do sleep 1; done
done
wait
# Every --out DIR the commands named, packed (their real-work/ folders, which hold every plan
# and the runners' logs, left out except the logs).
dirs=()
for cmd in "$@"; do
  d=$(echo "$cmd" | sed -n 's/.*--out \([^ ]*\).*/\1/p')
  [ -n "$d" ] && [ -d "$d" ] && dirs+=("$d")
done
if [ "${#dirs[@]}" -gt 0 ]; then
  tar -czf "$out/real.tgz" --exclude='*/real-work/scenarios' --exclude='*/real-work/runner-*/checkpoints' \
    --exclude='*/real-work/runner-*/pg' "${dirs[@]}" 2>> "$out/summary.txt"
fi
say "done in $(( $(date +%s) - t0 )) s"
exit 0
