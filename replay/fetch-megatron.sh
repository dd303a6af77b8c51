#!/bin/bash
# Extracts exactly megatron/core and megatron/training/checkpointing.py (plus miles_megatron_plugins where the commit has it) of the
# Megatron-LM commits the bundled revision profiles name, from local git mirrors, into a
# git-ignored folder of a ckptsim checkout, for the replay runner (replay/README.md).
#
#   replay/fetch-megatron.sh --nvidia GIT_DIR --radixark GIT_DIR [--dest DIR] [--prune] [--max-mib N]
#
#   --nvidia    a bare or normal git dir of NVIDIA/Megatron-LM that holds the NVIDIA commits below
#   --radixark  a bare or normal git dir of radixark/Megatron-LM that holds the radixark commits
#               (either may be omitted; its commits are then skipped)
#   --dest      where to put <label>/ folders (default: <toplevel of the current checkout>/.megatron)
#   --prune     delete tests/, docs/ and *.md, *.png, *.jpg, *.svg inside the archives
#   --max-mib   fail if the result is larger (default 60; the GPU machine's call carries 64 MiB)
#
# Each <label>/ gets CKPTSIM_UPSTREAM.json {"repo", "commit", "label"}: the replay runner maps a
# revision profile's "upstream" commit to the folder through it (--megatron-root). When --dest
# is the default, '/.megatron/' is added to the checkout's .git/info/exclude (once), so the
# archives are never committed. Nothing is downloaded: the mirrors must already hold the commits.
set -euo pipefail

NV="" RX="" DEST="" PRUNE=0 MAX_MIB=60
while [ $# -gt 0 ]; do
  case "$1" in
    --nvidia) NV=$2; shift 2;;
    --radixark) RX=$2; shift 2;;
    --dest) DEST=$2; shift 2;;
    --prune) PRUNE=1; shift;;
    --max-mib) MAX_MIB=$2; shift 2;;
    -h|--help) sed -n '2,18p' "$0"; exit 0;;
    *) echo "fetch-megatron.sh: unknown argument $1" >&2; exit 2;;
  esac
done

# label  repo  commit (full sha; the archive is made from exactly this commit)
COMMITS="
nv-d98e8a64dd NVIDIA/Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553
nv-f4502eb1c9 NVIDIA/Megatron-LM f4502eb1c92f77e0ed190cac00293e8ac192543b
nv-dceb1fb7ce NVIDIA/Megatron-LM dceb1fb7ce1d18c19c38815f3573180b6d527701
rx-2e64d788b6 radixark/Megatron-LM 2e64d788b67fe8155774200c87606e1e449c494b
rx-ef1b586f47 radixark/Megatron-LM ef1b586f47720d59a4cc7475da73ca9f7c434ca1
"

ADD_EXCLUDE=0
if [ -z "$DEST" ]; then
  TOP=$(git rev-parse --show-toplevel)
  DEST="$TOP/.megatron"
  ADD_EXCLUDE=1
fi
mkdir -p "$DEST"

echo "$COMMITS" | while read -r label repo commit; do
  [ -n "$label" ] || continue
  case "$repo" in
    NVIDIA/*) gitdir=$NV;;
    radixark/*) gitdir=$RX;;
  esac
  if [ -z "$gitdir" ]; then echo "skip $label ($repo: no mirror given)"; continue; fi
  if ! git --git-dir="$gitdir" cat-file -e "$commit^{commit}" 2>/dev/null; then
    echo "fetch-megatron.sh: $repo $commit is not in $gitdir" >&2; exit 1
  fi
  # training/checkpointing.py is read, never imported: the runner mirrors the training loop's
  # load_checkpoint() and asks this file which scheduler block it has (replay/schedule.py).
  paths="megatron/core megatron/training/checkpointing.py"
  if git --git-dir="$gitdir" cat-file -e "$commit:miles_megatron_plugins" 2>/dev/null; then
    paths="$paths miles_megatron_plugins"
  fi
  rm -rf "${DEST:?}/$label"
  mkdir -p "$DEST/$label"
  # shellcheck disable=SC2086
  git --git-dir="$gitdir" archive --format=tar "$commit" $paths | tar -x -C "$DEST/$label"
  if [ "$PRUNE" = 1 ]; then
    find "$DEST/$label" \( -name tests -o -name docs \) -type d -prune -exec rm -rf {} +
    find "$DEST/$label" -type f \( -name '*.md' -o -name '*.png' -o -name '*.jpg' -o -name '*.svg' \) -delete
  fi
  printf '{"repo": "%s", "commit": "%s", "label": "%s", "paths": "%s"}\n' \
    "$repo" "$commit" "$label" "$paths" > "$DEST/$label/CKPTSIM_UPSTREAM.json"
  echo "$label: $repo@$commit ($paths) $(du -sh "$DEST/$label" | cut -f1)"
done

if [ "$ADD_EXCLUDE" = 1 ]; then
  EXCLUDE="$(git rev-parse --git-path info/exclude)"
  mkdir -p "$(dirname "$EXCLUDE")"
  grep -qxF '/.megatron/' "$EXCLUDE" 2>/dev/null || echo '/.megatron/' >> "$EXCLUDE"
fi

KIB=$(du -sk "$DEST" | cut -f1)
echo "total: $((KIB / 1024)) MiB in $DEST"
if [ "$KIB" -gt $((MAX_MIB * 1024)) ]; then
  echo "fetch-megatron.sh: $DEST is larger than $MAX_MIB MiB; rerun with --prune" >&2
  exit 1
fi
