#!/usr/bin/env bash
# How `check --jobs N` scales on this machine: the same search (seed 1) at each N, timed
# wall-clock, with a check that every N found the same thing.
#
#   scripts/jobs-scaling.sh [REVISION] [CASES] [JOBS...]
#
# REVISION  default fix-complete; CASES default 2000; JOBS default "1 2 4 8 16" (each at most
#           the machine's cores is what the table means: more jobs than cores measures nothing).
# CKPTSIM_BIN  the ckptsim binary (default build/ckptsim).
# CKPTSIM_CHECK_ARGS  more arguments for every check (e.g. "--long-steps-max 0": no long phases).
# CKPTSIM_SPIN  K: K busy loops (`yes`) run on the other cores during every row, so that a row
#               of jobs 1 shows what a case costs when the machine is loaded by something that
#               shares nothing with ckptsim (clock, caches, memory), apart from ckptsim's own
#               contention.
#
# Prints a Markdown table: jobs, wall seconds, the search's own seconds (the summary's: without
# the process's start-up, libtorch's load among it), CPU seconds (user + system, every thread),
# busy (CPU seconds / (wall x jobs): below 1, jobs waited), cases/s, speed-up over jobs 1,
# speed-up / jobs, when the first finding was committed (seconds into the search: what an
# order of judging other than the cases' own costs the user), and whether the minimal
# scenarios are byte-identical to jobs 1's and the
# summary (failures, coverage, simulator runs; not its timings, nor the runs that jobs > 1 ran
# ahead and discarded) equal. Exits 1 if any N found something else. CPU seconds that grow with
# N mean each case cost more (shared caches, memory, a lower clock), not that jobs waited.
set -euo pipefail
cd "$(dirname "$0")/.."
revision="${1:-fix-complete}"
cases="${2:-2000}"
shift $(($# < 2 ? $# : 2))
jobs_list=("$@")
[[ ${#jobs_list[@]} -eq 0 ]] && jobs_list=(1 2 4 8 16)
bin="${CKPTSIM_BIN:-build/ckptsim}"
read -r -a check_args <<<"${CKPTSIM_CHECK_ARGS:-}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

# Everything a search wrote except the summary's own timing, one digest.
digest() {
  (cd "$1" && find . -type f ! -name ckptsim-summary.json -print0 | sort -z |
     xargs -0 -r sha256sum
   python3 -c 'import json,sys; d=json.load(open(sys.argv[1]));
for k in ("seconds", "shrink_seconds", "jobs", "discarded_runs"): d.pop(k, None)
for f in d.get("failures", []): f.pop("found_s", None)
print(json.dumps(d, sort_keys=True))' ckptsim-summary.json) | sha256sum | cut -c1-16
}

echo "ckptsim check --revision $revision --cases $cases --seed 1 ${check_args[*]} on $(nproc) CPUs${CKPTSIM_SPIN:+, $CKPTSIM_SPIN busy loops beside}" \
     "($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'))"
echo
echo "| jobs | wall s | search s | CPU s | busy | cases/s | speed-up | speed-up / jobs | first finding s | findings as jobs 1 |"
echo "|---|---|---|---|---|---|---|---|---|---|"
# Runs one search; prints its wall and CPU seconds (user + system, every thread).
timed_check() {
  python3 -c '
import resource, subprocess, sys, time
start = time.monotonic()
subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL)
wall = time.monotonic() - start
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(f"{wall:.2f} {usage.ru_utime + usage.ru_stime:.2f}")' "$@"
}
spinners=()
stop_spinners() { [[ ${#spinners[@]} -eq 0 ]] || kill "${spinners[@]}" 2>/dev/null || true; }
trap 'stop_spinners; rm -rf "$out"' EXIT
for ((k = 0; k < ${CKPTSIM_SPIN:-0}; k++)); do
  yes >/dev/null &
  spinners+=($!)
done
base_wall="" base_digest="" status=0
for j in "${jobs_list[@]}"; do
  dir="$out/jobs-$j"
  read -r wall cpu < <(timed_check "$bin" check --revision "$revision" --cases "$cases" \
    --seed 1 --jobs "$j" --quiet --out "$dir" "${check_args[@]}")
  search=$(python3 -c 'import json, sys; print("%.2f" % json.load(open(sys.argv[1]))["seconds"])' \
    "$dir/ckptsim-summary.json")
  # When the first finding was committed, seconds into the search ("-" without a finding).
  first=$(python3 -c 'import json, sys; f = json.load(open(sys.argv[1]))["failures"]
print("%.2f" % min(x["found_s"] for x in f) if f else "-")' "$dir/ckptsim-summary.json")
  d=$(digest "$dir")
  [[ -z "$base_wall" ]] && base_wall=$wall base_digest=$d
  same=yes
  [[ "$d" != "$base_digest" ]] && same="NO ($d vs $base_digest)" && status=1
  python3 -c "w=$wall; b=$base_wall; j=$j; c=$cpu
print(f'| {j} | {w:.2f} | $search | {c:.2f} | {c / (w * j):.2f} | {$cases / w:.1f} | {b / w:.2f} | {b / w / j:.2f} | $first | $same |')"
done
exit $status
