#!/usr/bin/env bash
# Replays the crash scenarios (issue 25, item 3) on the real Megatron-LM on the GPU machine: every
# plan under replay/plans/crash/ (made where ckptsim is built by `scripts/replay-crash-device.sh
# --make-plans`, committed) or the plans given as arguments, split over --parallel N runner
# processes (`python -m replay run`, each with its own worker pools and work folder), with TE
# emulated and the FusedAdam stand-in (the lent H200 has no TE). One trace per plan in
# $OUT/traces/<scenario>.trace.json, each runner's progress in $OUT/runner-<i>.log, the summary in
# $OUT/summary.txt. Every runner stops after --budget seconds (default 450): what it finished is
# kept.
#
#   scripts/replay-crash-device.sh [--parallel N] [--budget S] [PLAN...]
#   scripts/replay-crash-device.sh --make-plans      # here: scenarios -> replay/plans/crash/
#
# Then, where ckptsim is built (the traces fetched into DIR):
#   for t in DIR/traces/*.trace.json; do n=$(basename "$t" .trace.json)
#     build/ckptsim conform "$(ls scenarios/crash-replay/$n.json scenarios/$n.json 2>/dev/null | head -1)" "$t"
#   done
# Needs: .megatron/ (replay/fetch-megatron.sh; carried), PyTorch in $PYTHON (default
# /opt/torch/.venv/bin/python).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
plans_dir=replay/plans/crash

if [ "${1:-}" = "--make-plans" ]; then
  mkdir -p "$plans_dir"
  for s in scenarios/crash-replay/*.json scenarios/crash-overwrites-committed-checkpoint-upstream-head.json; do
    n=$(basename "$s" .json)
    build/ckptsim replay-plan "$s" -o "$plans_dir/$n.plan.json" || exit 1
  done
  exit 0
fi

out="${OUT:-out-crash}"
mkdir -p "$out/traces"
python="${PYTHON:-/opt/torch/.venv/bin/python}"
[ -x "$python" ] || python=python3
parallel=4
budget=450
plans=()
while [ $# -gt 0 ]; do
  case "$1" in
    --parallel) parallel=$2; shift 2;;
    --budget) budget=$2; shift 2;;
    -h|--help) sed -n '2,21p' "$0"; exit 0;;
    *) plans+=("$1"); shift;;
  esac
done
[ ${#plans[@]} -gt 0 ] || plans=("$plans_dir"/*.plan.json)
say() { echo "replay-crash: $*" | tee -a "$out/summary.txt"; }
say "${#plans[@]} plan(s), $parallel runner(s), budget $budget s, python $python"
"$python" -c 'import torch; print("torch", torch.__version__, "gpus", torch.cuda.device_count())' 2>&1 |
  tee -a "$out/summary.txt"

# Each runner gets a contiguous slice of the plans sorted by the revisions they name, so that it
# starts worker pools for few checkouts: 14 runners dealt plans round-robin, each starting pools
# for every revision, ran the H200 out of CUDA memory on 2026-12-05 (4 traces of 148 in 530 s;
# 7 runners on one revision set each: 148 in 257 s).
given=${#plans[@]}
mapfile -t plans < <("$python" - "${plans[@]}" <<'PY'
import json, sys
def revisions(path):
    with open(path) as f:
        return "+".join(sorted({r["revision"] for r in json.load(f)["runs"]}))
for p in sorted(sys.argv[1:], key=lambda p: (revisions(p), p)):
    print(p)
PY
)
if [ "${#plans[@]}" != "$given" ]; then
  say "could not read the revisions of the $given plan(s) given (a plan that does not exist or does not parse?)"
  exit 2
fi
per=$(( (${#plans[@]} + parallel - 1) / parallel ))
t0=$(date +%s)
pids=()
for ((i = 0; i < parallel; i++)); do
  mine=()
  for ((k = i * per; k < (i + 1) * per && k < ${#plans[@]}; k++)); do mine+=(--plan "${plans[k]}"); done
  [ ${#mine[@]} -gt 0 ] || continue
  work="/tmp/replay-crash-work-$i"
  rm -rf "$work"
  # A crash kills the job's ranks; --abort-grace bounds how long a rank that another's error
  # (not a crash) left waiting may go on; the collective timeout bounds a hang.
  timeout --kill-after=10 "$budget" "$python" -m replay run "${mine[@]}" --megatron-root .megatron \
    --out-dir "$out/traces" --emulate-te --fused-adam-standin --work-dir "$work" \
    --abort-grace 5 --collective-timeout 60 --run-timeout 180 > "$out/runner-$i.log" 2>&1 &
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=$?; done
say "runners done in $(( $(date +%s) - t0 )) s (last non-zero exit: $status)"
n=$(ls "$out/traces"/*.trace.json 2>/dev/null | wc -l)
say "$n trace(s) of ${#plans[@]} plan(s) written"
"$python" -m replay summarize "$out/traces"/*.trace.json >> "$out/summary.txt" 2>&1 || true
tail -n 40 "$out/summary.txt"
exit 0
