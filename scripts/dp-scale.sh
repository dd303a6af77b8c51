#!/usr/bin/env bash
# Wall time and peak memory of `ckptsim run` against DP (issue 11 item 7, production DP sizes).
# For each DP size N: scenarios/scale/dp<N>-to-<3N/4>.json (a reshard after losing a quarter
# of the nodes), or, for an N without a bundled file, the same scenario with N and 3N/4.
# Prints one Markdown table row per size (reports/dp-scale.md holds a measured table).
#
# Usage: scripts/dp-scale.sh [DP ...]        default: 512 1024 2048 4096
# Environment:
#   CKPTSIM_BUILD_DIR     the build with ckptsim (default: build)
#   DP_SCALE_CHECKPOINTS  memory (default: --memory) or disk (a directory under the build)
#
# Needs GNU time (/usr/bin/time, Debian package `time`) for the peak resident set size. A size
# above Scenario::kDpMax (the world's limit, sim/local_world.h) shows as an error row with
# ckptsim's message.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${CKPTSIM_BUILD_DIR:-build}"
bin="$build_dir/ckptsim"
checkpoints="${DP_SCALE_CHECKPOINTS:-memory}"
[[ -x "$bin" ]] || { echo "dp-scale: no $bin; run ./scripts/build.sh --target ckptsim" >&2; exit 2; }
[[ -x /usr/bin/time ]] || { echo "dp-scale: needs GNU time at /usr/bin/time" >&2; exit 2; }
case "$checkpoints" in
  memory) where=(--memory) ;;
  disk) where=(--checkpoint-dir "$build_dir/dp-scale-checkpoints") ;;
  *) echo "dp-scale: DP_SCALE_CHECKPOINTS is memory or disk, not $checkpoints" >&2; exit 2 ;;
esac
sizes=("$@")
[[ ${#sizes[@]} -gt 0 ]] || sizes=(512 1024 2048 4096)

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

echo "| DP | reshard | wall s | peak RSS MB | properties | trace hash |"
echo "|---:|---|---:|---:|---|---|"
for dp in "${sizes[@]}"; do
  [[ "$dp" =~ ^[0-9]+$ && "$dp" -ge 4 ]] || { echo "dp-scale: DP $dp is not an integer >= 4" >&2; exit 2; }
  target=$((dp * 3 / 4))
  scenario="scenarios/scale/dp${dp}-to-${target}.json"
  if [[ ! -f "$scenario" ]]; then
    scenario="$work/dp${dp}-to-${target}.json"
    python3 - "scenarios/scale/dp512-to-384.json" "$scenario" "$dp" "$target" <<'EOF'
import json, sys
template, out, dp, target = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
s = json.load(open(template))
s["name"] = f"dp{dp}-to-{target}"
s["phases"][0]["dp"], s["phases"][1]["dp"] = dp, target
json.dump(s, open(out, "w"), indent=2)
EOF
  fi
  rc=0
  rm -f "$work/trace"
  /usr/bin/time -f "%e %M" -o "$work/time" "$bin" run "${where[@]}" --quiet \
    --trace "$work/trace" "$scenario" >"$work/out" 2>&1 || rc=$?
  # GNU time puts "Command exited with non-zero status N" first when the run fails.
  read -r wall rss_kb < <(tail -n 1 "$work/time") || true
  hash="$(grep -o 'trace_hash=[0-9a-f]*' "$work/trace" 2>/dev/null | cut -d= -f2 || true)"
  case "$rc" in
    0) verdict="all pass" ;;
    1) verdict="some fail" ;;
    *) verdict="error (exit $rc): $(head -n 1 "$work/out" | cut -c1-160)" ;;
  esac
  printf '| %s | %s -> %s | %s | %d | %s | %s |\n' "$dp" "$dp" "$target" "$wall" \
    $((rss_kb / 1024)) "$verdict" "${hash:--}"
done
