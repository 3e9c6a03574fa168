#!/bin/bash
# Multi-thread scaling of the engine: in process, the seed 000, 001 and 004
# shapes with 1 to 16 jobs, engine and raw-device rows only (no fio needed),
# on a temporary image in /tmp; then metadata (bench metadata, bench tree).
# Usage: scripts/scaling.sh [path/to/foliofs]
# (default target/release/foliofs). docs/BENCHMARKS.md, "Scaling on 16
# cores", has a run.
set -u
B=$(realpath "${1:-target/release/foliofs}")
cd /tmp
echo "== machine: $(nproc) CPUs, $(free -g | awk '/Mem:/{print $2}') GiB, $(uname -r)"
df -h /tmp | tail -1
run() { # label, options, extra fio args
  local label=$1 opts=$2; shift 2
  local out; out=$($B bench ${opts:+-o $opts} "$@" 2>&1)
  local line; line=$(echo "$out" | grep -E "^\s+(read|write):" | head -1 | sed 's/^ *//')
  echo "$label | $line"
  echo "$out" | grep -E "error|Error" | head -2
}
S000="--name=seed000 --ioengine=libaio --direct=1 --group_reporting --overwrite=1 --thread --size=1G --filename=/fio --readwrite=write --ramp_time=1s --runtime=3s --time_based --blocksize=2k --iodepth=256"
for j in 1 2 4 8 16; do
  run "000 overwrite j=$j" dio_unaligned=overwrite $S000 --numjobs=$j
  run "000 exclusive j=$j" dio_unaligned=exclusive $S000 --numjobs=$j
  run "000 raw j=$j" "" --target raw $S000 --numjobs=$j
done
S001="--name=seed001 --ioengine=psync --rw=randwrite --overwrite=1 --pre_read=1 --direct=0 --bs=4k --size=256M --fdatasync=1 --runtime=3s --time_based --group_reporting"
for j in 1 4 8 16; do
  run "001 dirty=block j=$j" dirty=block,folio_max=64k $S001 --numjobs=$j
done
S004="--name=seed004 --ioengine=psync --direct=0 --rw=read --bs=4k --size=512M --runtime=3s --time_based --overwrite=1 --pre_read=1 --group_reporting"
for j in 1 4 8 16; do
  run "004 cached read 4k j=$j" cache_bytes=16G,dirty_background_bytes=64G,dirty_bytes=64G,writeback_interval_ms=0 $S004 --numjobs=$j
done
# Metadata (issue 36): creates from N threads in process, and the tree's
# phases from N jobs in process, through the mount and on the kernel peers
# (as root; each job its own subtree, then all in one set of directories).
# Each prints its scaling over 1 job, the metadata lock waits and the CPU
# per create of the jobs and of the engine threads beside them; on 1 KiB
# blocks too, where a 1 KiB file's folio is 1 KiB (on 4 KiB blocks the slab
# thread faulting in a fresh 4 KiB folio per file bounded 2 jobs on 2 CPUs).
for j in 1 2 4 8 16; do
  for block in 4096 1024; do
    echo "metadata --no-fsync --block-size $block j=$j | $($B bench metadata --no-fsync --file-size 1024 --block-size $block --files $((200000 / j)) --jobs $j 2>&1 | grep -E 'ops/s|CPU per op|lock waits' | tr -s ' ' | tr '\n' ' ')"
  done
  echo "metadata fsync j=$j | $($B bench metadata --file-size 1024 --files $((20000 / j)) --jobs $j 2>&1 | grep -E 'ops/s' | tr -s ' ')"
done
# The same create loop from 1 and 16 jobs in process, through the mount and
# on ext4 and XFS (--peers; root, mkfs.ext4, mkfs.xfs), each count in each
# run: the issue's "2x ext4 with 16 workers" (no fsync) and "3x ext4 in
# process, >= ext4 through the mount" (fsync'd creates). The summary table
# has each file system's rates, 16 / 1, and foliofs over ext4.
$B bench metadata --peers --no-fsync --file-size 1024 --files 12500 --jobs 1,16 --reps 3 2>/dev/null | grep -E '^\||median of'
$B bench metadata --peers --file-size 1024 --files 1250 --jobs 1,16 --reps 3 2>/dev/null | grep -E '^\||median of'
# Past the background threshold (a 4 GiB cache: 400 MiB), where one flusher
# writes the small files back in groups while the jobs create them: does it
# keep up with 16?
for j in 1 4 16; do
  echo "metadata past the background threshold j=$j | $($B bench metadata --no-fsync --file-size 1024 -o cache_bytes=4G --files $((800000 / j)) --jobs $j 2>&1 | grep -E 'ops/s|CPU per op|device per op' | tr -s ' ' | tr '\n' ' ')"
done
$B bench tree --files 200000 --jobs 1,2,4,8,16 --page-cache engine 2>&1 | grep -v '^running'
$B bench tree --files 200000 --jobs 1,16 --shared-dir --page-cache engine 2>&1 | grep -v '^running'
