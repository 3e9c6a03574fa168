#!/bin/bash
# Clones through the mount (run as root, FUSE): the time `cp` takes to copy
# a 10 GiB file (coreutils asks for FICLONE, then copy_file_range, which the
# mount answers with a clone) and the space it uses; then 4 KiB direct
# overwrites of an unshared file, of a clone (first a sequential pass that
# copies every block once, then random), and random overwrites into blocks
# still shared, with the device bytes the daemon wrote for them (journal
# included). Usage: scripts/clone-bench.sh [path/to/foliofs] [path/to/fio]
# (defaults target/release/foliofs, ../shared/tools/bin/fio).
# docs/BENCHMARKS.md, "Clones", has a run.
set -eu
F=$(realpath "${1:-target/release/foliofs}")
FIO=$(realpath "${2:-../shared/tools/bin/fio}")
work=$(mktemp -d /tmp/clone-bench.XXXXXX)
trap 'umount "$work/mnt" 2>/dev/null || true; rm -rf "$work"' EXIT
mkdir "$work/mnt"
cd "$work"

echo "== cp of a 10 GiB file through the mount"
"$F" mkfs big.img --size 12G >/dev/null
"$F" mount big.img mnt
sleep 1
dd if=/dev/zero of=mnt/big bs=4M count=2560 conv=fsync status=none
echo "blocks used before: $(df -B4096 --output=used mnt | tail -1)"
start=$(date +%s%N); cp mnt/big mnt/copy; end=$(date +%s%N)
echo "cp: $(( (end - start) / 1000 )) us"
start=$(date +%s%N); cp mnt/big mnt/copy2; sync mnt/copy2; end=$(date +%s%N)
echo "cp then fsync: $(( (end - start) / 1000 )) us"
echo "blocks used after: $(df -B4096 --output=used mnt | tail -1)"
cmp mnt/big mnt/copy
umount mnt; sleep 1
rm big.img

echo "== 4 KiB direct overwrites, iodepth 16, 512 MiB files"
"$F" mkfs cow.img --size 4G >/dev/null
"$F" mount cow.img mnt
sleep 1
pid=$(pgrep -f "mount $work/cow.img" | head -1)
written() { awk '/^write_bytes/ {print $2}' "/proc/$pid/io"; }
dd if=/dev/urandom of=mnt/plain bs=4M count=128 conv=fsync status=none
dd if=/dev/urandom of=mnt/base bs=4M count=128 conv=fsync status=none
cp mnt/base mnt/clone
sync mnt/clone
job() { # name file rw time_based
    local before after
    before=$(written)
    "$FIO" --name="$1" --filename="mnt/$2" --rw="$3" --bs=4k --direct=1 --ioengine=libaio \
        --iodepth=16 --size=512M --runtime=10 --time_based="$4" \
        --output-format=terse --terse-version=3 \
        | awk -F';' '{printf "%s: %.0f IOPS, %.0f MiB written by fio", $3, $49, $47 / 1024}'
    after=$(written)
    echo ", $(( (after - before) >> 20 )) MiB by the daemon"
}
job unshared-randwrite plain randwrite 1
job clone-first-pass clone write 0
job clone-randwrite-after clone randwrite 1
job shared-randwrite base randwrite 1
umount mnt; sleep 1
"$F" fsck cow.img
