#!/bin/bash
# Multi-thread scaling through a FUSE mount of foliofs, no fio needed: the
# jobs run with `foliofs bench --target files` on the mount's files, 1 to 16
# jobs, on each transport (io_uring, /dev/fuse), beside the same jobs in
# process. Rows: the round trip (4 KiB psync reads of one cached block per
# job) and 4 KiB direct random reads at iodepth 32 per job. As root, on a
# temporary image in /tmp. Usage: scripts/mount-scaling.sh [path/to/foliofs]
# (default target/release/foliofs). docs/BENCHMARKS.md, "Scaling on 16
# cores", has a run.
set -u
RT_JOBS=${RT_JOBS:-1 2 4 8 16}  # job counts of the round-trip rows
RR_JOBS=${RR_JOBS:-1 4 16}      # job counts of the random-read rows
MOUNT_OPTS=${MOUNT_OPTS:-}      # more -o options for the mounts (fuse_threads=16)
B=$(realpath "${1:-target/release/foliofs}")
WORK=$(mktemp -d /tmp/mount-scaling.XXXXXX)
IMG=$WORK/img
MNT=$WORK/mnt
mkdir -p "$MNT"
cleanup() { umount "$MNT" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT
echo "== machine: $(nproc) CPUs, $(free -g | awk '/Mem:/{print $2}') GiB, $(uname -r)"
echo "== enable_uring: $(cat /sys/module/fuse/parameters/enable_uring 2>/dev/null || echo absent)"
line() { # label, foliofs bench arguments...
  local label=$1; shift
  local out; out=$("$B" bench "$@" 2>&1)
  local figures; figures=$(echo "$out" | grep -E "^\s+(read|write):" | head -1 | sed 's/^ *//')
  echo "$label | $figures"
  echo "$out" | grep -iE "error" | head -2
}
RT="--ioengine=psync --direct=0 --rw=read --bs=4k --size=4k --runtime=3s --time_based --group_reporting"
RR="--ioengine=io_uring --direct=1 --rw=randread --bs=4k --size=256M --iodepth=32 --runtime=3s --time_based --group_reporting"
for transport in uring dev; do
  truncate -s 8G "$IMG"
  "$B" mkfs "$IMG" >/dev/null
  "$B" mount -f -o "transport=$transport${MOUNT_OPTS:+,$MOUNT_OPTS}" "$IMG" "$MNT" </dev/null >"$WORK/mount.log" 2>&1 &
  daemon=$!
  for _ in $(seq 500); do mountpoint -q "$MNT" && break; sleep 0.02; done
  grep -E "travel|falls back|note" "$WORK/mount.log" | sed 's/^/   /'
  for jobs in $RT_JOBS; do
    line "round trip, $transport, $jobs jobs" --target files --directory="$MNT/rt" --name=rt $RT --numjobs=$jobs
  done
  for jobs in $RR_JOBS; do
    line "4k direct randread qd32, $transport, $jobs jobs" --target files --directory="$MNT/rr" --name=rr $RR --numjobs=$jobs
  done
  umount "$MNT"
  wait $daemon
  rm -f "$IMG"
done
for jobs in $RT_JOBS; do
  line "round trip, in process, $jobs jobs" --name=rt $RT --numjobs=$jobs
done
for jobs in $RR_JOBS; do
  line "4k direct randread qd32, in process, $jobs jobs" --name=rr $RR --numjobs=$jobs
done
