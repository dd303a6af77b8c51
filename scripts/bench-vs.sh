#!/usr/bin/env bash
# Side-by-side search speed: this checkout's ckptsim_bench against a reference commit's, in one
# run on one machine, so that machine load falls on both alike.
#
#   scripts/bench-vs.sh REF [ROUNDS] [FILTER]
#
# REF     a commit (e.g. 3f4f898); its bench is built once in build-bench-ref/<REF>/ (a git
#         worktree under build-bench-ref/, git-ignored by /build*/) and reused on later runs.
# ROUNDS  how many times each bench runs, alternating reference and this checkout (default 3).
# FILTER  --benchmark_filter (default SearchCase: both revisions of BM_SearchCase).
#
# Environment:
#   CKPTSIM_BENCH_CPU         run every bench pinned to this one CPU (taskset -c): cases/s
#                             per core. Unset: unpinned (a bench whose ranks are threads may
#                             then use several cores for one case).
#   CKPTSIM_BENCH_REF_SRC     a directory holding REF's source (e.g. `git archive REF`), for a
#                             copy of the tree without .git (the GPU machine); else a worktree.
#   CKPTSIM_BENCH_CMAKE_ARGS  extra arguments for both configures (a libtorch elsewhere).
#   CKPTSIM_BENCH_JOBS        build parallelism (default 2).
#
# Prints, per benchmark, the median cases/s of each side over the rounds and the ratio
# (this / reference); then the spread (each side's min-max over the rounds, and the min-max of
# the per-round ratios); then the load average, since a loaded machine slows both unevenly.
# The generator may draw differently at REF (this repository's draws more: schedules, group
# multipliers), so the ratio compares the search as each commit runs it, not equal cases.
set -euo pipefail
cd "$(dirname "$0")/.."
ref="${1:?usage: scripts/bench-vs.sh REF [ROUNDS] [FILTER]}"
rounds="${2:-3}"
filter="${3:-SearchCase}"
jobs="${CKPTSIM_BENCH_JOBS:-2}"
read -r -a cmake_args <<<"${CKPTSIM_BENCH_CMAKE_ARGS:-}"
ref_root="build-bench-ref"
if [[ -n "${CKPTSIM_BENCH_REF_SRC:-}" ]]; then
  ref_sha="$ref"
  ref_src="$CKPTSIM_BENCH_REF_SRC"
  # A copy of the tree may carry a stale .git: the caller names the commit.
  this_sha="${CKPTSIM_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo this)}"
else
  ref_sha="$(git rev-parse --short=12 "$ref^{commit}")"
  ref_src="$ref_root/src-$ref_sha"
  this_sha="$(git rev-parse --short=12 HEAD)"
  if [[ ! -d "$ref_src" ]]; then
    mkdir -p "$ref_root"
    git worktree add --detach "$ref_src" "$ref_sha" >/dev/null
  fi
fi
ref_build="$ref_root/build-$ref_sha"
this_build="${CKPTSIM_BUILD_DIR:-build}"
cmake -S "$ref_src" -B "$ref_build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${cmake_args[@]}" >/dev/null
cmake --build "$ref_build" -j "$jobs" --target ckptsim_bench
cmake -S . -B "$this_build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${cmake_args[@]}" >/dev/null
cmake --build "$this_build" -j "$jobs" --target ckptsim_bench
pin=()
[[ -n "${CKPTSIM_BENCH_CPU:-}" ]] && pin=(taskset -c "$CKPTSIM_BENCH_CPU")

out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
for ((i = 0; i < rounds; i++)); do
  for side in ref this; do
    bin="$this_build/ckptsim_bench"
    [[ "$side" == ref ]] && bin="$ref_build/ckptsim_bench"
    echo "round $((i + 1))/$rounds: $side ($bin) ${pin[*]}" >&2
    "${pin[@]}" "$bin" --benchmark_filter="$filter" --benchmark_format=json >"$out/$side-$i.json"
  done
done

python3 - "$out" "$ref_sha" "$this_sha" "${CKPTSIM_BENCH_CPU:-unpinned}" <<'EOF'
import glob, json, os, statistics, sys
out, ref_sha, this_sha, cpu = sys.argv[1:5]
rates = {}  # (side, benchmark) -> [cases/s per round]
for path in sorted(glob.glob(os.path.join(out, "*.json")),
                   key=lambda p: int(os.path.basename(p).split("-")[1].split(".")[0])):
    side = os.path.basename(path).split("-")[0]
    for b in json.load(open(path))["benchmarks"]:
        name = b["name"].split("/")[1] if "/" in b["name"] else b["name"]
        rates.setdefault((side, name), []).append(b["items_per_second"])
print(f"{'benchmark':<16} {'ref ' + ref_sha:>20} {'this ' + this_sha:>20} {'ratio':>7}")
for name in sorted({n for _, n in rates}):
    ref = statistics.median(rates.get(("ref", name), [float("nan")]))
    this = statistics.median(rates.get(("this", name), [float("nan")]))
    print(f"{name:<16} {ref:>15.2f} c/s {this:>15.2f} c/s {this / ref:>6.2f}x")
# The spread: each side's rounds (min-max), and the ratio of each round's pair (this round's
# run against the reference's run just before it), min-max.
print()
for name in sorted({n for _, n in rates}):
    ref = rates.get(("ref", name), [])
    this = rates.get(("this", name), [])
    pairs = [t / r for r, t in zip(ref, this)]
    print(f"{name:<16} ref {min(ref):.2f}-{max(ref):.2f} c/s, this {min(this):.2f}-{max(this):.2f}"
          f" c/s, ratio per round {min(pairs):.2f}-{max(pairs):.2f}x")
print("cases/s are medians over the rounds; cpu:", cpu, "; load average now:",
      open("/proc/loadavg").read().split()[:3])
EOF
