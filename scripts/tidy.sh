#!/usr/bin/env bash
# The mechanical habits, checked (CI runs this from .ci/run before the tests):
#   1. clang-format: every C++/CUDA source is formatted as .clang-format says (100 columns);
#   2. determinism (STYLE.md §7): model/ and sim/ read no clock, no random_device, no rand(), and
#      declare an unordered container only with a `// lookup only` comment on the line (its
#      iteration order would leak into a run);
#   3. clang-tidy (.clang-tidy): functions of at most 70 lines (readability-function-size),
#      except those listed in scripts/tidy-function-size-allowlist.txt, a list that only shrinks:
#      a listed function that now fits is reported, so that its line is removed.
# Exit 0 when all hold; 1 with the offending places listed. Set CKPTSIM_TIDY_SKIP_CLANG_TIDY=1 to
# run 1 and 2 alone (seconds instead of minutes). --update-cache: rewrite the function-size cache
# (3 parses only the units it does not hold; commit it with the change).
set -uo pipefail
cd "$(dirname "$0")/.."
update_cache=0
[ "${1:-}" = "--update-cache" ] && update_cache=1
status=0
fail() { echo "tidy: $*" >&2; status=1; }

clang_format=$(command -v clang-format-14 || command -v clang-format || true)
clang_tidy=$(command -v clang-tidy-14 || command -v clang-tidy || true)
[ -n "$clang_format" ] || { echo "tidy: clang-format not found (scripts/setup.sh installs it)" >&2; exit 2; }

mapfile -t sources < <(git ls-files '*.cpp' '*.h' '*.cu' '*.hpp')

# 1. clang-format
if ! "$clang_format" --dry-run --Werror "${sources[@]}" 2>/tmp/ckptsim-tidy-format.txt; then
  grep -E '^[^ ].*(warning|error):' /tmp/ckptsim-tidy-format.txt | sed 's/: warning: code should be clang-formatted.*//' | sort -u | head -40 >&2
  fail "clang-format: the files above are not formatted (run: $clang_format -i <file>)"
fi

# 2. determinism in model/ and sim/
# (comment lines may name what they avoid)
banned=$(git grep -nE '#include <chrono>|std::chrono|random_device|\brand\(\)|\bsrand\(|time\(nullptr\)|time\(NULL\)' -- model sim \
         | grep -vE '^[^:]+:[0-9]+:[[:space:]]*//')
[ -z "$banned" ] || { echo "$banned" >&2; fail "model/ and sim/ must not read clocks or nondeterministic randomness"; }
unordered=$(git grep -nE 'std::unordered_(map|set|multimap|multiset)<' -- model sim | grep -v '// lookup only')
[ -z "$unordered" ] || { echo "$unordered" >&2; fail "an unordered container in model/ or sim/ without '// lookup only' (never iterate one there)"; }

# 3. clang-tidy: function size
if [ "${CKPTSIM_TIDY_SKIP_CLANG_TIDY:-0}" != 1 ]; then
  [ -n "$clang_tidy" ] || { echo "tidy: clang-tidy not found (scripts/setup.sh installs it)" >&2; exit 2; }
  db=${CKPTSIM_TIDY_BUILD_DIR:-build-tidy}
  # A compilation database without precompiled headers (clang cannot read GCC's).
  cmake -S . -B "$db" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_DISABLE_PRECOMPILE_HEADERS=ON \
    -DCKPTSIM_CUDA=OFF -DCKPTSIM_BUILD_BENCH=OFF >/dev/null || exit 2
  mapfile -t units < <(git ls-files 'model/*.cpp' 'sim/*.cpp' 'properties/*.cpp' 'search/*.cpp' \
                                    'report/*.cpp' 'app/*.cpp' 'cli/*.cpp')
  # The cache (scripts/tidy-function-size-cache.txt): a unit's function sizes depend on its own
  # text alone (HeaderFilterRegex is empty), so a unit whose content hash (git hash-object) the
  # cache holds for this clang-tidy version is not parsed again: CI parses only what changed
  # since the cache was written. Lines: "BLOB PATH" per unit, "BLOB PATH: FUNCTION" per function
  # over the limit. --update-cache rewrites it for the tree as it is.
  cache=scripts/tidy-function-size-cache.txt
  version="# clang-tidy $("$clang_tidy" --version | sed -n 's/.*version \([0-9.]*\).*/\1/p' | head -1)"
  mapfile -t blobs < <(git hash-object "${units[@]}")
  valid=0
  [ -f "$cache" ] && [ "$(head -1 "$cache")" = "$version" ] && valid=1
  to_run=()
  cached_findings=/tmp/ckptsim-tidy-cached.txt
  : >"$cached_findings"
  for i in "${!units[@]}"; do
    key="${blobs[$i]} ${units[$i]}"
    if [ "$valid" = 1 ] && grep -qxF "$key" "$cache"; then
      grep -F "$key: " "$cache" | cut -d' ' -f2- >>"$cached_findings"
    else
      to_run+=("${units[$i]}")
    fi
  done
  echo "tidy: clang-tidy on ${#to_run[@]} of ${#units[@]} units (the others' sizes are in $cache)"
  out=/tmp/ckptsim-tidy-functions.txt
  { [ "${#to_run[@]}" -eq 0 ] || printf '%s\n' "${to_run[@]}" \
      | xargs -P "$(nproc)" -n 4 "$clang_tidy" -p "$db" --quiet 2>/dev/null \
      | grep -E 'warning: function .* exceeds recommended size' \
      | sed -E "s|^$PWD/||; s|:[0-9]+:[0-9]+: warning: function '([^']+)'.*|: \1|"
    cat "$cached_findings"; } | sort -u >"$out"
  if [ "$update_cache" = 1 ]; then
    { echo "$version"
      for i in "${!units[@]}"; do
        echo "${blobs[$i]} ${units[$i]}"
        grep -F "${units[$i]}: " "$out" | sed "s|^|${blobs[$i]} |"
      done; } >"$cache"
    echo "tidy: wrote $cache"
  fi
  allow=scripts/tidy-function-size-allowlist.txt
  listed=$(grep -v '^#' "$allow" | sed '/^$/d' | sort -u)
  new=$(comm -23 "$out" <(echo "$listed"))
  fixed=$(comm -13 "$out" <(echo "$listed") | sed '/^$/d')
  [ -z "$new" ] || { echo "$new" >&2; fail "functions over 70 lines (split them; the allow-list only shrinks)"; }
  [ -z "$fixed" ] || { echo "$fixed" >&2; fail "these allow-listed functions now fit in 70 lines: remove them from $allow"; }
fi

[ "$status" = 0 ] && echo "tidy: clean"
exit "$status"
