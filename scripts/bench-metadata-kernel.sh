#!/usr/bin/env bash
# The kernel's side of `foliofs bench metadata`: the same create + write 4 KiB
# + fsync + close loop on ext4 or XFS, on a loop device (--direct-io=on) over
# a fully written 1 GiB file in the current directory (the same disk).
# Usage (as root): scripts/bench-metadata-kernel.sh ext4|xfs [files]
set -euo pipefail
fs=${1:?ext4 or xfs}
files=${2:-4000}
image=foliofs-kernel-bench.img
mnt=$(mktemp -d)
dd if=/dev/zero of="$image" bs=1M count=1024 oflag=direct status=none
loop=$(losetup --direct-io=on -f --show "$image")
cleanup() { umount "$mnt" 2>/dev/null || true; losetup -d "$loop" 2>/dev/null || true; rm -f "$image"; rmdir "$mnt"; }
trap cleanup EXIT
case "$fs" in
  ext4) mkfs.ext4 -q -F "$loop" ;;
  xfs) mkfs.xfs -q -f "$loop" ;;
  *) echo "unknown file system $fs" >&2; exit 2 ;;
esac
mount "$loop" "$mnt"
python3 - "$mnt" "$files" <<'PY'
import os, sys, time
root, files = sys.argv[1], int(sys.argv[2])
data = b"\xab" * 4096
os.makedirs(f"{root}/job0")
latencies = []
started = time.perf_counter()
for index in range(files):
    begun = time.perf_counter()
    fd = os.open(f"{root}/job0/f{index}", os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644)
    os.pwrite(fd, data, 0)
    os.fsync(fd)
    os.close(fd)
    latencies.append(time.perf_counter() - begun)
elapsed = time.perf_counter() - started
latencies.sort()
print(f"{files / elapsed:.0f} ops/s; latency p50 {latencies[len(latencies) // 2] * 1e6:.0f} us, "
      f"p99 {latencies[int(len(latencies) * 0.99)] * 1e6:.0f} us")
PY
