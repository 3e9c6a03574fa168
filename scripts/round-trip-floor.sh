#!/usr/bin/env bash
# What one FUSE round trip costs on this machine, against the floor of its
# design (docs/BENCHMARKS.md, "Through the mount"; the analysis in
# docs/bench/history/2026-11-28-mount-layout-fsync-round-trip.md): fio's 4 KiB cached psync reads through a fresh mount, unpinned
# and pinned to CPU 0; the system calls and context switches per round trip
# while pinned; and two threads passing a byte through a pipe on one CPU
# (two context switches per round trip, no FUSE). As root, with fio and perf.
#   FOLIOFS=path/to/foliofs OPTS=ring_sched=other scripts/round-trip-floor.sh
set -euo pipefail
foliofs=${FOLIOFS:-target/release/foliofs}
work=$(mktemp -d)
trap 'umount "$work/mnt" 2>/dev/null || true; wait; rm -rf "$work"' EXIT

truncate -s 1G "$work/img"
"$foliofs" mkfs "$work/img" >/dev/null
mkdir -p "$work/mnt"
"$foliofs" mount -f "$work/img" "$work/mnt" ${OPTS:+-o "$OPTS"} 2>/dev/null &
for _ in $(seq 100); do mountpoint -q "$work/mnt" && break; sleep 0.1; done

# Round trips per second; extra fio options in "$@".
round_trips() {
  fio --name=rt --filename="$work/mnt/rt" --ioengine=psync --direct=0 --rw=read --bs=4k \
    --size=4k --invalidate=0 --runtime="${SECONDS_PER_RUN:-3}s" --time_based \
    --output-format=terse "$@" | awk -F';' '{ print $8 }'
}

for run in 1 2; do
  echo "run $run: round trips/s unpinned $(round_trips), pinned to CPU 0 $(round_trips --cpus_allowed=0)"
done

SECONDS_PER_RUN=4 round_trips --cpus_allowed=0 >/dev/null &
reads=$!
sleep 1.5
perf stat -a -x, -e raw_syscalls:sys_enter,context-switches,fuse:fuse_request_send -- sleep 1 2>&1 |
  awk -F, '{ count[$3] = $1 } END {
    requests = count["fuse:fuse_request_send"]
    printf "per round trip (pinned): %.2f system calls, %.2f context switches (%d requests in 1 s)\n",
      count["raw_syscalls:sys_enter"] / requests, count["context-switches"] / requests, requests }'
wait "$reads"

for run in 1 2 3; do
  echo "pipe ping-pong on CPU 0: $(taskset -c 0 perf bench sched pipe -T -l 200000 |
    awk '/usecs\/op/ { print $1 }') us per round trip"
done
