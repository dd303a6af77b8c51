#!/usr/bin/env bash
# Records real traces of scenario files on a GPU machine (the lent H200, a self-hosted runner):
# builds the plan writer (`ckptsim replay-plan`, against this machine's PyTorch libtorch, CUDA
# off: a plan's gradients are ckptsim's own exact sums, not the GPU's), writes every scenario's
# plan there (plans of long phases at DP 8 run to tens of MB: they are not carried), and replays
# them with the replay runner on the Megatron checkouts of --megatron-root, several runners at
# once. Plans are grouped by the revisions they name, so that each runner starts workers for few
# checkouts (importing megatron costs seconds a worker).
#
#   scripts/record-traces.sh [--runners N] [--megatron-root DIR] [--values]
#                            [--check-plans DIR] [--replay-arg ARG]... SCENARIO_OR_DIR...
#
#   --runners N        runners at once (default: 8)
#   --megatron-root    the folders of replay/fetch-megatron.sh (default: .megatron)
#   --values           the runner's --values (every hashed array in the trace)
#   --check-plans DIR  plans written elsewhere (another machine's ckptsim): each must be byte
#                      for byte the plan written here for the same scenario, or the script stops
#   --replay-arg ARG   passed to `python -m replay run` (repeatable); default --emulate-te
#                      --fused-adam-standin --abort-grace 10 --run-timeout 300
#
# Needs: nvcc-free cmake + ninja + g++, the .debs of scripts/fetch-debs.sh (in $CKPTSIM_DEBS,
# default .debs/), PyTorch in $PYTHON (default /opt/torch/.venv/bin/python, else python3).
# Writes to $OUT (default out-traces/): traces.tgz (traces/<group>/<scenario>.trace.json),
# record.log (this script and every runner's output). Exit 0 when every plan was replayed (what
# Megatron did is data), 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
runners=8
mroot=.megatron
values=""
check_plans=""
replay_args=()
inputs=()
while [ $# -gt 0 ]; do
  case "$1" in
    --runners) runners=$2; shift 2;;
    --megatron-root) mroot=$2; shift 2;;
    --values) values=--values; shift;;
    --check-plans) check_plans=$2; shift 2;;
    --replay-arg) replay_args+=("$2"); shift 2;;
    --replay-arg=*) replay_args+=("${1#--replay-arg=}"); shift;;
    -h|--help) sed -n '2,26p' "$0"; exit 0;;
    *) inputs+=("$1"); shift;;
  esac
done
[ "${#replay_args[@]}" -gt 0 ] || replay_args=(--emulate-te --fused-adam-standin --abort-grace 10
                                               --run-timeout 300)
[ "${#inputs[@]}" -gt 0 ] || { echo "record-traces: name scenario files or folders" >&2; exit 2; }
python="${PYTHON:-/opt/torch/.venv/bin/python}"
[ -x "$python" ] || python=python3
out="${OUT:-out-traces}"
work="${CKPTSIM_RECORD_WORK:-/tmp/ckptsim-record}"
mkdir -p "$out" "$work"
log="$out/record.log"
: > "$log"
say() { echo "record-traces: $*" | tee -a "$log"; }
t0=$(date +%s)

# ---- the plan writer ------------------------------------------------------------------------
prefix=/tmp/ckptsim-deps
rm -rf "$prefix" && mkdir -p "$prefix"
for f in "${CKPTSIM_DEBS:-.debs}"/*.deb; do
  if command -v dpkg-deb >/dev/null; then dpkg-deb -x "$f" "$prefix"
  else (tmp=$(mktemp -d) && cd "$tmp" && ar x "$root/$f" && tar -xf data.tar.* -C "$prefix"); fi
done
torch_prefix="$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)')" ||
  { say "no PyTorch in $python"; exit 1; }
export CMAKE_POLICY_VERSION_MINIMUM=3.5
build="${CKPTSIM_RECORD_BUILD:-$work/build}"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCKPTSIM_CUDA=OFF \
  -DCKPTSIM_FMT_HEADER_ONLY=ON -DCKPTSIM_BUILD_TESTS=OFF -DCKPTSIM_BUILD_BENCH=OFF \
  "-DCMAKE_PREFIX_PATH=$prefix/usr;$torch_prefix" >> "$log" 2>&1 &&
  cmake --build "$build" --target ckptsim -- -j"$(nproc)" >> "$log" 2>&1 ||
  { say "building ckptsim failed (the end of $log)"; tail -30 "$log"; exit 1; }
say "ckptsim built in $(( $(date +%s) - t0 )) s"

# ---- plans, grouped by the revisions they name -----------------------------------------------
rm -rf "$work/plans" && mkdir -p "$work/plans/all"
scenarios=()
for i in "${inputs[@]}"; do
  if [ -d "$i" ]; then
    for f in "$i"/*.json; do scenarios+=("$f"); done
  else
    scenarios+=("$i")
  fi
done
"$build/ckptsim" replay-plan "${scenarios[@]}" -o "$work/plans/all" >> "$log" 2>&1 ||
  { say "replay-plan failed (the end of $log)"; tail -5 "$log"; exit 1; }
say "${#scenarios[@]} scenarios, $(ls "$work/plans/all" | wc -l) plans ($(du -sh "$work/plans/all" | cut -f1))"
if [ -n "$check_plans" ]; then
  for p in "$check_plans"/*.plan.json; do
    cmp -s "$p" "$work/plans/all/$(basename "$p")" ||
      { say "plan $(basename "$p") differs from $p: the two builds disagree"; exit 1; }
  done
  say "$(ls "$check_plans"/*.plan.json | wc -l) plans byte for byte equal to $check_plans"
fi
"$python" - "$work/plans" "$runners" <<'PY' >> "$log"
import json, os, sys
root, n = sys.argv[1], int(sys.argv[2])
groups = {}
for f in sorted(os.listdir(os.path.join(root, "all"))):
    with open(os.path.join(root, "all", f)) as fh:
        plan = json.load(fh)
    revs = "+".join(sorted({r["revision"] for r in plan["runs"]}))
    cost = sum(r.get("steps", 0) * r.get("dp", 1) + 10 for r in plan["runs"])
    groups.setdefault(revs, []).append((cost, f))
# Each group split into chunks of about equal cost, so that n runners stay busy.
total = sum(c for g in groups.values() for c, _ in g)
chunk_cost = max(1, total // (2 * n))
k = 0
for revs, items in sorted(groups.items()):
    items.sort(reverse=True)
    chunks = [[]]
    acc = 0
    for c, f in items:
        if acc >= chunk_cost and chunks[-1]:
            chunks.append([])
            acc = 0
        chunks[-1].append(f)
        acc += c
    for ch in chunks:
        d = os.path.join(root, "g%02d-%s" % (k, revs))
        os.makedirs(d)
        for f in ch:
            os.rename(os.path.join(root, "all", f), os.path.join(d, f))
        print("group g%02d %s: %d plans" % (k, revs, len(ch)))
        k += 1
PY

# ---- replay, several runners at once ---------------------------------------------------------
rm -rf "$work/traces" && mkdir -p "$work/traces"
export PYTHONUNBUFFERED=1
pids=()
for d in "$work"/plans/g*; do
  while [ "$(jobs -rp | wc -l)" -ge "$runners" ]; do sleep 1; done
  g=$(basename "$d")
  PYTHONPATH="$root" "$python" -m replay run --plan "$d" --megatron-root "$mroot" \
    --out-dir "$work/traces/$g" --work-dir "$work/runs/$g" $values "${replay_args[@]}" \
    > "$work/$g.log" 2>&1 &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
for f in "$work"/g*.log; do { echo "== $(basename "$f")"; cat "$f"; } >> "$log"; done
n=$(find "$work/traces" -name '*.trace.json' | wc -l)
say "$n traces in $(( $(date +%s) - t0 )) s (runner exit status: $rc)"
tar czf "$out/traces.tgz" -C "$work" traces
exit $rc
