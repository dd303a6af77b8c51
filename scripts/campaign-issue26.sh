#!/usr/bin/env bash
# Writes the issue-26 conformance campaign, scenarios/campaign-issue26/: `ckptsim generate
# --campaign` with the precision-aware optimizer's low-precision states (--state-dtype bf16
# --state-dtype fp16: fused_adam cases with --use-precision-aware-optimizer, TE's master weights
# and remainders; hybrid cases with the dtypes its HDO ignores) and with MoE models (--ep-max 4:
# expert params in the ChainedOptimizer's expert part) at the three revisions whose checkouts
# the device machine carries, and across 2874 -> HEAD. Seeds 81-89 (no earlier campaign used
# them); the hand-written files there (not gen-*) are left alone. Then checks that every file
# parses and runs (`ckptsim run --memory`: exit 0 or 1, a property failing being a verdict; 2 or
# 3 fail the script) and prints the coverage. The README says what the real code did with them.
#
#   scripts/campaign-issue26.sh            # build/ckptsim; CKPTSIM_BUILD_DIR=DIR for another build
#   scripts/campaign-issue26.sh --no-run   # write and count the files, skip the run
set -euo pipefail
cd "$(dirname "$0")/.."
ckptsim="${CKPTSIM_BUILD_DIR:-build}/ckptsim"
out=scenarios/campaign-issue26
[ -x "$ckptsim" ] || { echo "campaign-issue26.sh: $ckptsim not built (scripts/build.sh)" >&2; exit 2; }

mkdir -p "$out"
rm -f "$out"/gen-*.json
expected=0
generate() {  # CASES SEED FLAGS...
  local cases=$1 seed=$2
  shift 2
  "$ckptsim" generate --campaign --cases "$cases" --seed "$seed" --out "$out" "$@" >/dev/null
  expected=$((expected + cases))
}

# TE's precision-aware FusedAdam (three of four fused_adam cases; the rest plain FusedAdam).
low=(--kind fused_adam --state-dtype bf16 --state-dtype fp16)
generate 60 81 "${low[@]}" --revision upstream-head
generate 20 82 "${low[@]}" --revision upstream-2874
generate 20 83 "${low[@]}" --revision miles-main
generate 20 84 "${low[@]}" --revision upstream-2874 --revision upstream-head --cross
# The hybrid with the dtypes (its HDO keeps every state fp32, upstream as the model).
hdo=(--kind hybrid --state-dtype bf16 --state-dtype fp16)
generate 20 85 "${hdo[@]}" --revision upstream-head
generate 10 86 "${hdo[@]}" --revision upstream-2874

# MoE models (--ep-max 4: every other case of two params or more has expert params, EP 1, 2 or 4,
# in a ChainedOptimizer's expert part), all three optimizer kinds, and with the low-precision
# states on fused_adam.
generate 60 87 --ep-max 4 --revision upstream-head
generate 30 88 --ep-max 4 --revision upstream-2874
generate 30 89 --ep-max 4 "${low[@]}" --revision upstream-head

files=("$out"/gen-*.json)
if [ "${#files[@]}" != "$expected" ]; then
  echo "campaign-issue26.sh: ${#files[@]} files in $out, expected $expected (a name written twice?)" >&2
  exit 1
fi
echo "campaign-issue26.sh: $expected scenarios in $out"

if [ "${1:-}" != --no-run ]; then
  rc=0
  "$ckptsim" run --memory --quiet "${files[@]}" || rc=$?
  if [ "$rc" -gt 1 ]; then
    echo "campaign-issue26.sh: ckptsim run --memory exited $rc (a file that does not parse or run)" >&2
    exit 1
  fi
  echo "campaign-issue26.sh: ckptsim run --memory exit $rc ($([ "$rc" = 0 ] && echo 'every property holds' || echo 'some scenario fails a property'))"
fi
"$ckptsim" coverage "${files[@]}"
