#!/usr/bin/env bash
# How `check --jobs N` scales on this machine: the same search (seed 1) at each N, timed
# wall-clock, with a check that every N found the same thing.
#
#   scripts/jobs-scaling.sh [REVISION] [CASES] [JOBS...]
#
# REVISION  default fix-complete; CASES default 2000; JOBS default "1 2 4 8 16" (each at most
#           the machine's cores is what the table means: more jobs than cores measures nothing).
# CKPTSIM_BIN  the ckptsim binary (default build/ckptsim).
#
# Prints a Markdown table: jobs, wall seconds, cases/s, speed-up over jobs 1, speed-up / jobs,
# and whether the minimal scenarios are byte-identical to jobs 1's and the summary (failures,
# coverage, simulator runs; not its timings, nor the runs that jobs > 1 ran ahead and
# discarded) equal. Exits 1 if any N found something else.
set -euo pipefail
cd "$(dirname "$0")/.."
revision="${1:-fix-complete}"
cases="${2:-2000}"
shift $(($# < 2 ? $# : 2))
jobs_list=("$@")
[[ ${#jobs_list[@]} -eq 0 ]] && jobs_list=(1 2 4 8 16)
bin="${CKPTSIM_BIN:-build/ckptsim}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

# Everything a search wrote except the summary's own timing, one digest.
digest() {
  (cd "$1" && find . -type f ! -name ckptsim-summary.json -print0 | sort -z |
     xargs -0 -r sha256sum
   python3 -c 'import json,sys; d=json.load(open(sys.argv[1]));
for k in ("seconds", "shrink_seconds", "jobs", "discarded_runs"): d.pop(k, None)
print(json.dumps(d, sort_keys=True))' ckptsim-summary.json) | sha256sum | cut -c1-16
}

echo "ckptsim check --revision $revision --cases $cases --seed 1 on $(nproc) CPUs" \
     "($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'))"
echo
echo "| jobs | wall s | cases/s | speed-up | speed-up / jobs | findings as jobs 1 |"
echo "|---|---|---|---|---|---|"
base_wall="" base_digest="" status=0
for j in "${jobs_list[@]}"; do
  dir="$out/jobs-$j"
  start=$(date +%s.%N)
  "$bin" check --revision "$revision" --cases "$cases" --seed 1 --jobs "$j" --quiet \
    --out "$dir" >/dev/null || true
  end=$(date +%s.%N)
  wall=$(python3 -c "print(f'{$end - $start:.2f}')")
  d=$(digest "$dir")
  [[ -z "$base_wall" ]] && base_wall=$wall base_digest=$d
  same=yes
  [[ "$d" != "$base_digest" ]] && same="NO ($d vs $base_digest)" && status=1
  python3 -c "w=$wall; b=$base_wall; j=$j
print(f'| {j} | {w:.2f} | {$cases / w:.1f} | {b / w:.2f} | {b / w / j:.2f} | $same |')"
done
exit $status
