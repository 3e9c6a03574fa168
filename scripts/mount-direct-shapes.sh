#!/usr/bin/env bash
# Direct I/O shapes through a fresh mount, the figures of 2026-11-28 in
# docs/bench/history/2026-11-28-mount-max-background.md: seed 000's shape,
# one job's 4 KiB direct reads and writes at iodepth 64 (random and
# sequential), and the round trip (4 KiB cached psync reads). Each shape
# gets a fresh image and mount, with a 1 GiB file laid out by 1 MiB direct
# writes. As root, with fio.
#   FOLIOFS=path/to/foliofs OPTS=max_background=256 scripts/mount-direct-shapes.sh
# A/B: run it for each build (FOLIOFS) or option set (OPTS), alternated.
set -euo pipefail
foliofs=${FOLIOFS:-target/release/foliofs}
work=$(mktemp -d)
trap 'umount "$work/mnt" 2>/dev/null || true; wait; rm -rf "$work"' EXIT

fresh_mount() {
  umount "$work/mnt" 2>/dev/null || true
  wait
  rm -f "$work/img"
  truncate -s 3G "$work/img"
  "$foliofs" mkfs "$work/img" >/dev/null
  mkdir -p "$work/mnt"
  "$foliofs" mount -f "$work/img" "$work/mnt" ${OPTS:+-o "$OPTS"} 2>/dev/null &
  for _ in $(seq 100); do mountpoint -q "$work/mnt" && break; sleep 0.1; done
  fio --name=layout --filename="$work/mnt/fio" --size=1G --rw=write --bs=1M --direct=1 \
    --ioengine=libaio --iodepth=4 >/dev/null
}

# IOPS (reads and writes together) of a fio run on the mount.
iops() {
  fio --filename="$work/mnt/fio" --thread --output-format=terse "$@" |
    awk -F';' '{ print $8 + $49 }'
}

fresh_mount
echo "seed 000 (8 jobs, 2 KiB sequential direct writes, iodepth 256): $(iops --name=seed000 \
  --ioengine=libaio --direct=1 --group_reporting --overwrite=1 --size=1G --readwrite=write \
  --ramp_time=1s --runtime=5s --time_based --numjobs=8 --blocksize=2k --iodepth=256)"
for rw in randread read randwrite; do
  fresh_mount
  echo "$rw 4 KiB direct, 1 job, iodepth 64: $(iops --name="$rw" --size=1G --ioengine=libaio \
    --direct=1 --iodepth=64 --rw="$rw" --bs=4k --ramp_time=1s --runtime=4s --time_based)"
done
fresh_mount
echo "round trips/s (4 KiB cached psync reads): $(fio --name=rt --filename="$work/mnt/rt" \
  --ioengine=psync --direct=0 --rw=read --bs=4k --size=4k --invalidate=0 --runtime=4s \
  --time_based --output-format=terse | awk -F';' '{ print $8 }')"
