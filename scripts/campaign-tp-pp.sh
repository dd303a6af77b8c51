#!/usr/bin/env bash
# Writes the TP/PP conformance campaign, scenarios/campaign-tp-pp/ (its README says what it is
# for): `ckptsim generate --campaign --tp-max 4 --pp-max 4 --params-max 4` at every revision,
# mostly fully reshardable (a resume may change TP, PP and DP only onto such a checkpoint), a
# fifth dp_reshardable, and one cross-revision pair. Seeds 61-71 (the other campaigns used
# 1-57), so every name is new. Then runs every file on the model (`ckptsim run --memory`: exit 0
# or 1, a property failing being a verdict; 2 or 3 fail the script) and prints the coverage.
#
#   scripts/campaign-tp-pp.sh            # build/ckptsim; CKPTSIM_BUILD_DIR=DIR for another build
#   scripts/campaign-tp-pp.sh --no-run   # write and count the files, skip the run
set -euo pipefail
cd "$(dirname "$0")/.."
ckptsim="${CKPTSIM_BUILD_DIR:-build}/ckptsim"
out=scenarios/campaign-tp-pp
[ -x "$ckptsim" ] || { echo "campaign-tp-pp.sh: $ckptsim not built (scripts/build.sh)" >&2; exit 2; }

mkdir -p "$out"
rm -f "$out"/gen-*.json
expected=0
generate() {  # CASES SEED FORMAT FLAGS...
  local cases=$1 seed=$2 format=$3
  shift 3
  local formats=(--sharding-type fully_reshardable)
  [ "$format" = dpr ] && formats=(--sharding-type dp_reshardable)
  "$ckptsim" generate --campaign --tp-max 4 --pp-max 4 --params-max 4 "${formats[@]}" \
    --cases "$cases" --seed "$seed" --out "$out" "$@" >/dev/null
  expected=$((expected + cases))
}

generate 60 61 fr --revision upstream-head
generate 15 62 dpr --revision upstream-head
generate 35 63 fr --revision upstream-2874
generate 10 64 dpr --revision upstream-2874
generate 30 65 fr --revision upstream-pre-2874
generate 10 66 dpr --revision upstream-pre-2874
generate 35 67 fr --revision miles-main
generate 10 68 dpr --revision miles-main
generate 30 69 fr --revision pr69-graft
generate 10 70 dpr --revision pr69-graft
generate 15 71 fr --revision miles-main --revision upstream-2874 --cross

files=("$out"/gen-*.json)
if [ "${#files[@]}" != "$expected" ]; then
  echo "campaign-tp-pp.sh: ${#files[@]} files in $out, expected $expected (a name written twice?)" >&2
  exit 1
fi
echo "campaign-tp-pp.sh: $expected scenarios in $out"

if [ "${1:-}" != --no-run ]; then
  start=$(date +%s.%N)
  rc=0
  "$ckptsim" run --memory --quiet "${files[@]}" || rc=$?
  end=$(date +%s.%N)
  if [ "$rc" -gt 1 ]; then
    echo "campaign-tp-pp.sh: ckptsim run --memory exited $rc (not a verdict: a file that does not parse or run)" >&2
    exit 1
  fi
  printf 'campaign-tp-pp.sh: ckptsim run --memory over all %d: %.0f s (exit %d)\n' "$expected" \
    "$(echo "$end - $start" | bc)" "$rc"
fi
"$ckptsim" coverage "${files[@]}"
