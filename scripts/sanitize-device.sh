#!/usr/bin/env bash
# scripts/sanitize.sh on a machine without a package manager (the lent GPU machine): the
# Debian packages of .debs/ (scripts/fetch-debs.sh) unpacked into a prefix, libtorch from the
# installed PyTorch, the GPU runner's configuration (scripts/gpu-runner.sh: fmt header-only,
# CUDA on, so that this libtorch configures) with -DCKPTSIM_SANITIZE=ON, then `ctest -L cpu`
# under ASan+UBSan with sanitize.sh's options (the GPU tests are not built with sanitizers).
#
#   scripts/sanitize-device.sh build   # configure and build ckptsim and ckptsim_tests
#   scripts/sanitize-device.sh test    # run the cpu tests (extra arguments go to ctest)
#
# Logs go to $OUT (default build-sanitize/out): configure.log, build.log, ctest.log,
# sanitizer-reports.txt. Exit status: the build's, or 1 when a test failed or any sanitizer
# report other than ASan's swapcontext warning was written.
set -uo pipefail
cd "$(dirname "$0")/.."
step="${1:-build}"
shift || true
build="build-sanitize"
out="${OUT:-$build/out}"
mkdir -p "$out"
python="${PYTHON:-/opt/torch/.venv/bin/python}"
prefix="${CKPTSIM_DEPS_PREFIX:-/tmp/ckptsim-deps}"
if [[ "$step" == build ]]; then
  rm -rf "$prefix" && mkdir -p "$prefix"
  for f in .debs/*.deb; do dpkg-deb -x "$f" "$prefix"; done
  torch_prefix="$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)')"
  export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" CMAKE_POLICY_VERSION_MINIMUM=3.5
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCKPTSIM_SANITIZE=ON \
    -DCKPTSIM_CUDA=ON -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc -DCKPTSIM_FMT_HEADER_ONLY=ON \
    -DCKPTSIM_BUILD_BENCH=OFF -DPYTHON_EXECUTABLE="$python" \
    "-DCMAKE_PREFIX_PATH=$prefix/usr;$torch_prefix" >"$out/configure.log" 2>&1 || {
    tail -30 "$out/configure.log"
    exit 1
  }
  start=$SECONDS
  cmake --build "$build" --target ckptsim ckptsim_tests -- -j"$(nproc)" >"$out/build.log" 2>&1
  status=$?
  echo "build: exit $status in $((SECONDS - start)) s on $(nproc) cores" | tee -a "$out/build.log"
  [[ $status -eq 0 ]] || tail -30 "$out/build.log"
  exit $status
fi
# The same options as scripts/sanitize.sh (see there for why each is set).
logs="$build/sanitizer-logs"
rm -rf "$logs" && mkdir -p "$logs"
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:detect_odr_violation=0:protect_shadow_gap=0:log_path=$PWD/$logs/asan"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$PWD/$logs/ubsan"
export LD_LIBRARY_PATH="$prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
start=$SECONDS
status=0
ctest --test-dir "$build" --output-on-failure -j"$(nproc)" -L cpu "$@" >"$out/ctest.log" 2>&1 ||
  status=$?
echo "ctest: exit $status in $((SECONDS - start)) s" | tee -a "$out/ctest.log"
cat "$logs"/* 2>/dev/null | grep -v "doesn't fully support makecontext/swapcontext" \
  >"$out/sanitizer-reports.txt" || true
if [[ -s "$out/sanitizer-reports.txt" ]]; then
  echo "sanitizer reports: $(wc -l <"$out/sanitizer-reports.txt") lines (sanitizer-reports.txt)"
  status=1
fi
grep -E "tests passed|tests failed" "$out/ctest.log"
exit $status
