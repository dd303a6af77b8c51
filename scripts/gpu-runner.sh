#!/usr/bin/env bash
# Builds and runs ckptsim's GPU part on a CUDA machine that has PyTorch installed but no
# package manager access (the lent GPU machine, or a self-hosted CI runner):
#   1. unpacks the Debian packages that scripts/fetch-debs.sh downloaded (directory
#      $CKPTSIM_DEBS, default .debs/) into a prefix ($CKPTSIM_DEPS_PREFIX, default
#      /tmp/ckptsim-deps) with dpkg-deb -x: Eigen, fmt, nlohmann-json, CLI11, GoogleTest/GMock
#      (Debian ships libgtest.a and libgmock.a, so nothing is compiled from source),
#      RapidCheck, Google Benchmark;
#   2. finds libtorch's CMake config through the installed PyTorch
#      (torch.utils.cmake_prefix_path);
#   3. configures with CKPTSIM_CUDA=ON against that libtorch and that prefix; if libtorch
#      cannot be configured against, or the torch-using GPU targets do not build, it falls back
#      to CKPTSIM_KERNELS_ONLY=ON (kernel, kernel-vs-CPU tests and benchmark, no torch), so
#      one run on the device still yields the kernel's correctness and bandwidth;
#   4. builds the GPU targets (and with CKPTSIM_GPU_BUILD_ALL=1 everything else, then runs
#      `ctest -L cpu`: the simulator against this libtorch), runs `ctest -L gpu`,
#      records what the binary holds for the GPU (cuobjdump), runs the benchmark with JSON
#      output, and writes reports/gpu-fused-adam.md (scripts/gpu-bench-report.py).
# Outputs go to $OUT when set (the device tool brings back what is under it; at most 8 files,
# so there are 5: runner.log, ctest-gpu.log, kernel-cuobjdump.txt, gpu-fused-adam.json,
# gpu-fused-adam.md; 6 with ctest-cpu.log), else to $CKPTSIM_GPU_BUILD_DIR/out.
#
# fmt: the PyTorch wheel ships fmt 12 headers in torch/include/fmt, and Debian's fmt is 9.
# Two fmt versions can live in one process (each sits in its own inline namespace,
# fmt::v9 / fmt::v12, and libtorch uses fmt header-only internally), so the only hazard is
# which headers a translation unit of ours sees. With CKPTSIM_FMT_HEADER_ONLY=ON the build
# links fmt::fmt-header-only (FMT_HEADER_ONLY: fmt 9 is compiled into our objects, no libfmt
# is linked or loaded) and puts fmt's include directory before libtorch's on ckptsim_model, so
# every <fmt/...> of ours is fmt 9. The GPU targets themselves use no fmt at all.
#
# Environment: CKPTSIM_DEBS, CKPTSIM_DEPS_PREFIX, CKPTSIM_GPU_BUILD_DIR (default build-gpu),
# CKPTSIM_COMMIT (the commit to name in the report where the tree has no .git),
# CKPTSIM_GPU_BUILD_ALL=1 (also build everything against this libtorch and run ctest -L cpu;
# its outcome is reported, not part of the exit status), PYTHON (default python3),
# OUT. Exit status: 0 when every GPU test passed (skips count as passes only where no GPU is
# visible: on a machine with nvidia-smi a skipped kernel test is a failure) and the benchmark
# ran; 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
debs="${CKPTSIM_DEBS:-.debs}"
prefix="${CKPTSIM_DEPS_PREFIX:-/tmp/ckptsim-deps}"
build="${CKPTSIM_GPU_BUILD_DIR:-build-gpu}"
out="${OUT:-$build/out}"
python="${PYTHON:-python3}"
mkdir -p "$out"
: > "$out/runner.log"

say() { echo "gpu-runner: $*"; }
die() { say "FAILED: $*"; exit 1; }

main() {

# ---- tools ----------------------------------------------------------------------------------
nvcc="$(command -v nvcc || true)"
[ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc
[ -n "$nvcc" ] || die "no nvcc on PATH or in /usr/local/cuda/bin"
export PATH="$(dirname "$nvcc"):$PATH"
say "commit ${CKPTSIM_COMMIT:-$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)}"
say "$(uname -srm); $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME"); $(nproc) CPUs"
say "cmake: $(cmake --version | head -1); ninja: $(ninja --version 2>/dev/null || echo none)"
say "c++: $(c++ --version | head -1)"
say "nvcc: $("$nvcc" --version | tail -1)"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>&1 \
  || say "nvidia-smi: not available"
gpu_visible=0
nvidia-smi -L >/dev/null 2>&1 && gpu_visible=1

# ---- Debian packages into a prefix ----------------------------------------------------------
shopt -s nullglob
deb_files=("$debs"/*.deb)
if [ "${#deb_files[@]}" -gt 0 ]; then
  rm -rf "$prefix" && mkdir -p "$prefix"
  for f in "${deb_files[@]}"; do
    if command -v dpkg-deb >/dev/null; then
      dpkg-deb -x "$f" "$prefix" || die "dpkg-deb -x $f"
    else  # a .deb is an ar archive holding data.tar.*
      tmp="$(mktemp -d)"
      (cd "$tmp" && ar x "$root/$f" && tar -xf data.tar.* -C "$prefix") || die "unpacking $f"
      rm -rf "$tmp"
    fi
  done
  say "unpacked ${#deb_files[@]} packages into $prefix"
else
  say "no .deb files in $debs: using the packages already on this machine"
fi

# ---- libtorch from the installed PyTorch ----------------------------------------------------
torch_prefix="$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null || true)"
if [ -n "$torch_prefix" ]; then
  say "torch $("$python" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "device", torch.cuda.is_available())' 2>&1); cmake prefix $torch_prefix"
else
  say "no PyTorch importable with $python: kernels-only build"
fi
# libtorch's CUDA CMake code reads the architectures from here instead of probing the GPU.
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
# Debian's CMake package files declare policy ranges; a CMake 4 accepts them, older ones too.
export CMAKE_POLICY_VERSION_MINIMUM=3.5

common=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DCKPTSIM_CUDA=ON -DCMAKE_CUDA_COMPILER="$nvcc"
        -DCKPTSIM_FMT_HEADER_ONLY=ON -DCKPTSIM_CUDA_PTXAS_VERBOSE=ON -DCKPTSIM_GPU_TESTS=EACH
        -DPYTHON_EXECUTABLE="$(command -v "$python")"  # libtorch's CUDA CMake hashes nvrtc with it
        "-DCMAKE_PREFIX_PATH=$prefix/usr${torch_prefix:+;$torch_prefix}")
targets=(ckptsim_gpu_tests ckptsim_gpu_bench ckptsim_kernel_ptx)

mode=full
if [ -z "$torch_prefix" ] || ! configure_and_build "$build"; then
  [ -n "$torch_prefix" ] && say "the build against libtorch failed (above)"
  say "falling back to CKPTSIM_KERNELS_ONLY=ON: the kernel, its tests and the benchmark, no torch"
  mode=kernels-only
  build="$build-kernels"
  configure_and_build "$build" -DCKPTSIM_KERNELS_ONLY=ON || die "the kernels-only build failed"
fi
say "build mode: $mode ($build)"
# The flags nvcc really got (libtorch's CMake may add global CUDA flags; rounding depends on
# none of them, but a -ftz or --use_fast_math here would be worth knowing).
"$python" - "$build/compile_commands.json" <<'PY' || true
import json, sys
for c in json.load(open(sys.argv[1])):
    if c["file"].endswith("fused_adam_cuda.cu"):
        print("gpu-runner: nvcc command:", c.get("command") or " ".join(c.get("arguments", [])))
PY
ctest --test-dir "$build" -R cuda_kernel_ptx_rounding --output-on-failure \
  | grep -E "tests passed|tests failed|forbidden|required|Error" || true

# ---- what the binary holds for the GPU ------------------------------------------------------
{
  echo "## cuobjdump --list-elf --list-ptx libckptsim_cuda.a"
  cuobjdump --list-elf --list-ptx "$build/libckptsim_cuda.a" 2>&1
  echo "## cuobjdump --dump-resource-usage libckptsim_cuda.a"
  cuobjdump --dump-resource-usage "$build/libckptsim_cuda.a" 2>&1
  echo "## cuobjdump --dump-sass libckptsim_cuda.a (FFMA here comes from the IEEE div/sqrt"
  echo "## sequences that ptxas expands div.rn/sqrt.rn into; the PTX has no fma.f32)"
  cuobjdump --dump-sass "$build/libckptsim_cuda.a" 2>&1
} > "$out/kernel-cuobjdump.txt"
say "$(grep -E 'ELF file|PTX file' "$out/kernel-cuobjdump.txt" | tr '\n' ' ')"
say "$(grep -E 'REG:|STACK:' "$out/kernel-cuobjdump.txt" | head -2 | tr '\n' ' ')"

# ---- optionally, everything else (the simulator against this libtorch) ----------------------
all_rc=skipped
if [ "${CKPTSIM_GPU_BUILD_ALL:-0}" = 1 ] && [ "$mode" = full ]; then
  say "CKPTSIM_GPU_BUILD_ALL=1: building everything and running ctest -L cpu"
  if cmake --build "$build" -- -j"$(nproc)"; then
    ctest --test-dir "$build" -L cpu -j"$(nproc)" > "$out/ctest-cpu.log" 2>&1
    all_rc=$?
    grep -E "tests passed|tests failed" "$out/ctest-cpu.log" || true
  else
    all_rc=build-failed
  fi
  say "full build and CPU suite: $all_rc (does not change the exit status)"
fi

# ---- GPU tests ------------------------------------------------------------------------------
ctest --test-dir "$build" -L gpu --output-on-failure 2>&1 | tee "$out/ctest-gpu.log"
tests_rc=${PIPESTATUS[0]}
skipped=$(grep -c "\*\*\*Skipped" "$out/ctest-gpu.log" || true)
if [ "$gpu_visible" = 1 ] && grep -q "CudaFusedAdam.*\*\*\*Skipped" "$out/ctest-gpu.log"; then
  say "a GPU is visible but the kernel tests skipped: counted as a failure"
  grep -m1 -A3 "Skipped" "$out/ctest-gpu.log" || true
  tests_rc=1
fi
say "ctest -L gpu: exit $tests_rc, $skipped skipped"

# ---- benchmark and report -------------------------------------------------------------------
bench_rc=0
"$build/ckptsim_gpu_bench" --benchmark_out="$out/gpu-fused-adam.json" \
  --benchmark_out_format=json --benchmark_counters_tabular=true || bench_rc=$?
if [ "$bench_rc" = 0 ]; then
  "$python" "$root/scripts/gpu-bench-report.py" "$out/gpu-fused-adam.json" \
    "$root/reports/gpu-fused-adam.md" --tests-log "$out/ctest-gpu.log" >/dev/null || bench_rc=$?
  cp "$root/reports/gpu-fused-adam.md" "$out/gpu-fused-adam.md" 2>/dev/null || true
fi

echo
say "summary: mode=$mode tests_rc=$tests_rc bench_rc=$bench_rc all=$all_rc"
grep -E "tests passed|tests failed" "$out/ctest-gpu.log" || true
grep -E "^\| " "$out/gpu-fused-adam.md" 2>/dev/null || true
[ "$tests_rc" = 0 ] && [ "$bench_rc" = 0 ]
}

configure_and_build() {  # $1: build dir, rest: extra cmake arguments
  local dir="$1"; shift
  say "configure $dir $*"
  cmake -S "$root" -B "$dir" "${common[@]}" "$@" || return 1
  say "build ${targets[*]}"
  cmake --build "$dir" --target "${targets[@]}" -- -j"$(nproc)" || return 1
}

# Everything goes to the terminal and to runner.log; the pipeline ends before the script
# does, so the log is complete when the device tool collects $OUT.
main 2>&1 | tee -a "$out/runner.log"
exit "${PIPESTATUS[0]}"
