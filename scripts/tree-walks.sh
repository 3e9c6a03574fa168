#!/usr/bin/env bash
# Warm walks of a tree, as a shell user runs them: `find`, `du -s` and
# `ls -lR` over a tree of small files, on each directory given (a foliofs
# mount, a kernel file system to compare with). The tree (DIRS directories
# of FILES files of 1 KiB, default 200 x 50) is made in DIR/walks first; one
# walk of each kind warms the caches, then RUNS (default 5) of each are
# timed and the median printed, in ms. The tree is removed at the end.
#
#   scripts/tree-walks.sh /mnt/foliofs /mnt/ext4
set -euo pipefail
if [ $# -eq 0 ]; then
  echo "usage: $0 DIR..." >&2
  exit 2
fi
dirs_count=${DIRS:-200}
files_count=${FILES:-50}
runs=${RUNS:-5}

median_ms() {
  local times=()
  for _ in $(seq "$runs"); do
    local started ended
    started=$(date +%s%N)
    "$@" >/dev/null
    ended=$(date +%s%N)
    times+=($(((ended - started) / 1000)))
  done
  printf '%s\n' "${times[@]}" | sort -n | awk '{ t[NR] = $1 } END { printf "%.1f", t[int((NR + 1) / 2)] / 1000 }'
}

printf '%-40s %10s %10s %10s\n' "directory" "find (ms)" "du (ms)" "ls -lR (ms)"
for dir in "$@"; do
  tree="$dir/walks"
  rm -rf "$tree"
  python3 - "$tree" "$dirs_count" "$files_count" <<'PY'
import os, sys
root, dirs, files = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
data = b"x" * 1024
for d in range(dirs):
    path = os.path.join(root, f"d{d // 20}", f"s{d}")
    os.makedirs(path)
    for f in range(files):
        with open(os.path.join(path, f"f{f}"), "wb") as out:
            out.write(data)
PY
  find "$tree" >/dev/null
  du -s "$tree" >/dev/null
  ls -lR "$tree" >/dev/null
  printf '%-40s %10s %10s %10s\n' "$dir" "$(median_ms find "$tree")" \
    "$(median_ms du -s "$tree")" "$(median_ms ls -lR "$tree")"
  rm -rf "$tree"
done
