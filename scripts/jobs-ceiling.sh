#!/usr/bin/env bash
# The best `check --jobs N` can do on this machine: N copies of the same one-job search at once,
# one per CPU, sharing nothing but the machine (its caches, its memory bandwidth, its clock),
# against one copy alone. Neither a schedule nor less sharing inside ckptsim beats it: a search
# split into N equal parts that run under the same load gets at most 1 / (the copies' mean
# slowdown) per job, and pays the process's start-up once on top.
#
#   scripts/jobs-ceiling.sh [REVISION] [CASES] [N]
#
# REVISION default fix-complete; CASES default 2000; N default every CPU (nproc).
# CKPTSIM_BIN  the ckptsim binary (default build/ckptsim).
# CKPTSIM_CHECK_ARGS  more arguments for every check, as in scripts/jobs-scaling.sh.
#
# Prints one copy alone before and after the N (wall and search seconds: the summary's, without
# the start-up), the N copies' search seconds (min, median, mean, max), their mean slowdown over
# the mean of the two alone, and two ceilings of speed-up / jobs at N:
#   search only  1 / mean slowdown
#   whole run    alone wall / (N x (start-up + alone search x mean slowdown / N)), start-up being
#                alone wall minus alone search: what scripts/jobs-scaling.sh's last column can
#                reach at N, with every case split evenly and nothing else lost.
# Each copy is pinned to CPU k with taskset where it exists. Exits 1 if a copy failed to run.
set -euo pipefail
cd "$(dirname "$0")/.."
revision="${1:-fix-complete}"
cases="${2:-2000}"
n="${3:-$(nproc)}"
bin="${CKPTSIM_BIN:-build/ckptsim}"
read -r -a check_args <<<"${CKPTSIM_CHECK_ARGS:-}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
pin=()
command -v taskset >/dev/null && pin=(taskset -c)

# One search in $1 (a directory), pinned to CPU $2; writes "wall search" to $1.times.
one() {
  local dir=$1 cpu=$2 start end cmd=()
  [[ ${#pin[@]} -gt 0 ]] && cmd=("${pin[@]}" "$cpu")
  cmd+=("$bin" check --revision "$revision" --cases "$cases" --seed 1 --jobs 1 --quiet
        --out "$dir" "${check_args[@]}")
  start=$(date +%s.%N)
  "${cmd[@]}" >/dev/null 2>&1 || true
  end=$(date +%s.%N)
  python3 -c 'import json, sys
search = json.load(open(sys.argv[1] + "/ckptsim-summary.json"))["seconds"]
print(f"{float(sys.argv[3]) - float(sys.argv[2]):.3f} {search:.3f}")' \
    "$dir" "$start" "$end" >"$dir.times" 2>/dev/null || echo "failed" >"$dir.times"
}

echo "ckptsim check --revision $revision --cases $cases --seed 1 --jobs 1${check_args[*]:+ ${check_args[*]}}:" \
     "$n copies at once on $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'))" \
     "$([[ ${#pin[@]} -gt 0 ]] && echo pinned)"
one "$out/alone-before" 0
for ((k = 0; k < n; k++)); do one "$out/copy-$k" "$((k % $(nproc)))" & done
wait
one "$out/alone-after" 0
python3 - "$out" "$n" <<'EOF'
import statistics, sys
out, n = sys.argv[1], int(sys.argv[2])
def times(name):
    text = open(f"{out}/{name}.times").read().split()
    if text == ["failed"]:
        sys.exit(f"jobs-ceiling: the search in {name} did not run (no summary)")
    return float(text[0]), float(text[1])
alone = [times("alone-before"), times("alone-after")]
copies = [times(f"copy-{k}")[1] for k in range(n)]
alone_wall = statistics.mean(w for w, _ in alone)
alone_search = statistics.mean(s for _, s in alone)
slowdown = statistics.mean(copies) / alone_search
startup = max(0.0, alone_wall - alone_search)
whole = alone_wall / (n * (startup + alone_search * slowdown / n))
print(f"alone: wall {alone[0][0]:.2f} and {alone[1][0]:.2f} s, search {alone[0][1]:.2f} and "
      f"{alone[1][1]:.2f} s (start-up and exit {startup:.2f} s)")
print(f"{n} copies, search s: min {min(copies):.2f}, median {statistics.median(copies):.2f}, "
      f"mean {statistics.mean(copies):.2f}, max {max(copies):.2f}")
print(f"mean slowdown {slowdown:.2f}x (copies {min(copies) / alone_search:.2f}-"
      f"{max(copies) / alone_search:.2f}x)")
print(f"ceiling of speed-up / jobs at {n}: search only {1 / slowdown:.2f}; whole run {whole:.2f}")
EOF
