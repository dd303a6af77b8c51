#!/usr/bin/env bash
# Where a running process's threads are: samples every thread's state (R running, S sleeping,
# D waiting on I/O) and, when not running, its wait channel (futex_do_wait: a lock or a
# condition variable), COUNT times INTERVAL seconds apart, and prints how often each was seen,
# the process's first thread ("main") apart from the others ("worker").
#
#   scripts/thread-states.sh PID [COUNT] [INTERVAL]     default 150 samples, 0.01 s apart
#
# For `check --jobs N`: workers mostly R means the cores are busy with cases; workers in
# futex_do_wait while the main thread runs means they wait for the thread that commits results.
set -euo pipefail
pid="${1:?usage: scripts/thread-states.sh PID [COUNT] [INTERVAL]}"
count="${2:-150}"
interval="${3:-0.01}"
samples=0
for ((i = 0; i < count; i++)); do
  [[ -d /proc/$pid/task ]] || break
  for task in /proc/"$pid"/task/*; do
    tid="${task##*/}"
    stat="$(cat "$task/stat" 2>/dev/null)" || continue
    rest="${stat##*) }"
    state="${rest%% *}"
    who=worker
    [[ "$tid" == "$pid" ]] && who=main
    if [[ "$state" == R ]]; then
      echo "$who R"
    else
      echo "$who $state $(cat "$task/wchan" 2>/dev/null || echo '?')"
    fi
  done
  samples=$((samples + 1))
  sleep "$interval"
done | sort | uniq -c | sort -rn
echo "(threads seen over $count samples of PID $pid)"
