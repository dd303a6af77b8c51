#!/usr/bin/env bash
# The long libFuzzer runs of fuzz/ on the lent GPU machine (16 cores, GCC 13, CMake 4, no
# clang, no package manager), in one call of at most 10 minutes (reports/fuzzing.md).
#
# The fuzzers are built there, with GCC: binaries built here link Debian 12's libtorch 1.13,
# whose shared libraries come to about 470 MiB (285 of them: OpenCV, FFmpeg, GDAL, ...), far
# over what a call may carry (64 MiB). So GCC compiles the same fuzz targets against the
# installed PyTorch, with -fsanitize=address,undefined and
# -fsanitize-coverage=trace-pc,trace-cmp, and links libFuzzer's archive from clang 14, carried
# (fuzz/fuzzers.cmake CKPTSIM_LIBFUZZER, fuzz/gcc_coverage.cpp). Tried here with g++ 12 and
# Debian's libtorch: torch_save_fuzzer 13,170 exec/s, dcp_reader_fuzzer 3,285,
# scenario_fuzzer 1,459 (clang: 14,331, 4,885, about 1,960), coverage growing in each.
#
#   scripts/fuzz-device.sh prepare [BUILD_DIR]
#       here, before the call: fills build-fuzz/device/ (git-ignored; carry it, with .debs of
#       scripts/fetch-debs.sh) with libFuzzer's archive and corpora.tar.gz, the corpora grown
#       under BUILD_DIR/fuzz-corpus/ (default build-fuzz, scripts/fuzz.sh long), merged.
#   scripts/fuzz-device.sh run [BUDGET_S] [FUZZER=WORKERS ...]
#       there: unpacks .debs, builds build-fuzz-gcc/ (the 8 fuzzers and their seeds), then runs
#       WORKERS processes of each FUZZER at once, one corpus per fuzzer (seeds, the carried
#       corpus, the committed reproducers), until BUDGET_S (default 520) seconds after the
#       script started. A worker that stops early (a crash) is started again, at most 3 times.
#
# Into $OUT (default build-fuzz-gcc/out): summary.txt (per fuzzer: workers, seconds, the sum
# of stat::number_of_executed_units over its workers' runs, exec/s, artifacts) and
# fuzz-device.tar.gz (summary, the last lines of every log, every artifact, the corpus units
# found there). Exit 0 when no fuzzer left an artifact; 1 otherwise; 2 when the build failed.
set -uo pipefail
cd "$(dirname "$0")/.."
step="${1:-run}"
shift || true
carry=build-fuzz/device
all_fuzzers=(pickle_tree_fuzzer dcp_metadata_fuzzer torch_save_fuzzer dcp_reader_fuzzer
             torch_dist_checkpoint_fuzzer scenario_fuzzer revision_profile_fuzzer trace_fuzzer)

if [[ "$step" == prepare ]]; then
  set -e
  from="${1:-build-fuzz}"
  mkdir -p "$carry"
  # libFuzzer 14's own trace-pc hook aborts; weakened, fuzz/gcc_coverage.cpp's takes its place.
  objcopy --weaken-symbol=__sanitizer_cov_trace_pc \
    "$(clang++-14 -print-file-name=libclang_rt.fuzzer-x86_64.a)" "$carry/libfuzzer-gcc.a"
  rm -rf "$carry/corpora" && mkdir -p "$carry/corpora"
  for f in "${all_fuzzers[@]}"; do
    [[ -d "$from/fuzz-corpus/$f" ]] || continue
    mkdir -p "$carry/corpora/$f"
    # -merge=1 keeps the smallest set of units with the same coverage.
    ASAN_OPTIONS=detect_leaks=0 "$from/$f" -merge=1 "$carry/corpora/$f" \
      "$from/fuzz-corpus/$f" >"$carry/merge-$f.log" 2>&1
  done
  tar -C "$carry" -czf "$carry/corpora.tar.gz" corpora && rm -rf "$carry/corpora"
  ls -l "$carry"
  du -sh "$carry"
  du -sh .debs 2>/dev/null || echo "no .debs/ here: run scripts/fetch-debs.sh (it is carried too)"
  exit 0
fi
[[ "$step" == run ]] || { echo "usage: $0 prepare [BUILD_DIR] | run [BUDGET_S] [FUZZER=N ...]" >&2; exit 2; }

budget="${1:-520}"
shift || true
plan=("$@")
if [[ ${#plan[@]} -eq 0 ]]; then
  # What one call can take towards 10 M each (reports/fuzzing.md): the fast readers first.
  plan=(dcp_reader_fuzzer=7 torch_save_fuzzer=3 dcp_metadata_fuzzer=6)
fi
build=build-fuzz-gcc
out="${OUT:-$build/out}"
work=/tmp/ckptsim-fuzz
mkdir -p "$out"
# A warm machine keeps the corpus grown by the previous call ($work/corpus); the rest starts afresh.
mkdir -p "$work" && find "$work" -mindepth 1 -maxdepth 1 ! -name corpus -exec rm -rf {} +
python="${PYTHON:-/opt/torch/.venv/bin/python}"
prefix="${CKPTSIM_DEPS_PREFIX:-/tmp/ckptsim-deps}"
rm -rf "$prefix" && mkdir -p "$prefix"
for f in .debs/*.deb; do dpkg-deb -x "$f" "$prefix"; done
torch_prefix="$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)')"
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" CMAKE_POLICY_VERSION_MINIMUM=3.5
# CUDA on only so that the PyTorch wheel's CMake package configures (scripts/sanitize-device.sh);
# no CUDA code is built.
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCKPTSIM_FUZZ=ON \
  "-DCKPTSIM_LIBFUZZER=$PWD/$carry/libfuzzer-gcc.a" -DCKPTSIM_WERROR=OFF \
  -DCKPTSIM_CUDA=ON -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc -DCKPTSIM_FMT_HEADER_ONLY=ON \
  -DCKPTSIM_BUILD_TESTS=OFF -DCKPTSIM_BUILD_BENCH=OFF -DPYTHON_EXECUTABLE="$python" \
  "-DCMAKE_PREFIX_PATH=$prefix/usr;$torch_prefix" >"$out/configure.log" 2>&1 || {
  tail -30 "$out/configure.log"
  exit 2
}
cmake --build "$build" --target "${all_fuzzers[@]}" ckptsim_fuzz_corpora -- -j"$(nproc)" \
  >"$out/build.log" 2>&1 || {
  grep -B2 -A12 -m3 -E "error|FAILED" "$out/build.log"
  exit 2
}
echo "build: done at $SECONDS s on $(nproc) cores"
[[ -f "$carry/corpora.tar.gz" ]] && tar -C "$work" -xzf "$carry/corpora.tar.gz"
mkdir -p "$work/corpora"

export LD_LIBRARY_PATH="$prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export ASAN_OPTIONS="abort_on_error=1:detect_odr_violation=0:protect_shadow_gap=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export LSAN_OPTIONS="suppressions=$PWD/fuzz/lsan.supp"
end=$((budget - 25))  # leaves time to summarize and pack
[[ $((end - SECONDS)) -ge 30 ]] || { echo "no time left to fuzz (build ended at $SECONDS s)"; exit 2; }
fuzz_start=$SECONDS

# One worker: the fuzzer until `end`, started again after an early stop, at most 3 times.
# Worker 1 of each fuzzer keeps libFuzzer's leak checks; the others run without them
# (-detect_leaks=0). libtorch's zip reader leaks its state on some damaged archives
# (fuzz/lsan.supp), and libFuzzer answers each such input with a full LeakSanitizer pass, about
# 100 times the input's own time; it gives the checks up by itself after 1000 such inputs, so
# a long run checked no more than this before (reports/fuzzing.md).
worker() {
  local f=$1 i=$2 run=0 left leaks=()
  [[ $i -eq 1 ]] || leaks=(-detect_leaks=0)
  while left=$((end - SECONDS)) && [[ $left -ge 5 && $run -lt 4 ]]; do
    run=$((run + 1))
    regressions=()
    [[ -d "tests/fixtures/fuzz-regressions/$f" ]] && regressions=("tests/fixtures/fuzz-regressions/$f")
    "$build/$f" "${leaks[@]}" -max_total_time="$left" -timeout=30 -print_final_stats=1 -seed=$((1000 * i + run)) \
      -artifact_prefix="$work/artifacts/$f/" "$work/corpus/$f" "$build/fuzz-seeds/$f" \
      "$work/corpora/$f" "${regressions[@]}" >"$work/logs/$f.$i.$run.log" 2>&1 && break
  done
}
mkdir -p "$work/logs"
for entry in "${plan[@]}"; do
  f=${entry%=*} n=${entry#*=}
  mkdir -p "$work/corpus/$f" "$work/artifacts/$f" "$work/corpora/$f"
  for ((i = 1; i <= n; i++)); do worker "$f" "$i" & done
done
wait
seconds=$((SECONDS - fuzz_start))

status=0  # 1 when any fuzzer left an artifact (a crash, a leak, a timeout)
[[ -z "$(find "$work/artifacts" -type f)" ]] || status=1
{
  echo "fuzz-device: $(nproc) cores, fuzzing ${seconds} s (build and setup: $fuzz_start s)"
  printf '%-30s %7s %8s %12s %9s %s\n' fuzzer workers runs execs exec/s artifacts
  for entry in "${plan[@]}"; do
    f=${entry%=*} n=${entry#*=}
    execs=$(cat "$work/logs/$f".*.log | grep -a 'stat::number_of_executed_units' |
            awk '{s += $2} END {print s + 0}')
    runs=$(ls "$work/logs/$f".*.log | wc -l)
    arts=$(ls "$work/artifacts/$f" | wc -l)
    printf '%-30s %7s %8s %12s %9s %s\n' "$f" "$n" "$runs" "$execs" \
      "$((execs / (seconds > 0 ? seconds : 1)))" "$arts $(ls "$work/artifacts/$f" | head -3 | tr '\n' ' ')"
  done
} | tee "$out/summary.txt"
# The last lines of each log (stats, or the sanitizer's report), artifacts, new corpus units.
mkdir -p "$work/pack/logs"
for l in "$work/logs"/*.log; do tail -80 "$l" >"$work/pack/logs/$(basename "$l")"; done
cp "$out/summary.txt" "$work/pack/"
cp -r "$work/artifacts" "$work/pack/"
cp -r "$work/corpus" "$work/pack/"
tar -C "$work/pack" -czf "$out/fuzz-device.tar.gz" .
if [[ $(stat -c %s "$out/fuzz-device.tar.gz") -gt 15000000 ]]; then  # over what comes back
  rm -rf "$work/pack/corpus"
  tar -C "$work/pack" -czf "$out/fuzz-device.tar.gz" .
fi
ls -l "$out"
exit $status
