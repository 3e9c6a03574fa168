#!/bin/bash
# Clones through the mount (run as root, FUSE): the time `cp` takes to copy
# a 10 GiB file (coreutils asks for FICLONE, then copy_file_range, which the
# mount answers with a clone) and the space it uses; then 4 KiB direct
# overwrites of an unshared file, of a clone (first a sequential pass that
# copies every block once, then random), and random overwrites into blocks
# still shared, with the device bytes written for them (the daemon's, journal
# included); buffered random overwrites of an unshared file and of a clone's
# shared blocks (each copy's space reserved at write time, written back by
# the end fsync). Then the same steps on kernel XFS with reflink=1 on a loop
# device with direct I/O (`cp --reflink=always`; device bytes from the loop
# device's counters). Usage: scripts/clone-bench.sh [path/to/foliofs]
# [path/to/fio] (defaults target/release/foliofs, ../shared/tools/bin/fio).
# docs/BENCHMARKS.md, "Clones", has a run.
set -eu
F=$(realpath "${1:-target/release/foliofs}")
FIO=$(realpath "${2:-../shared/tools/bin/fio}")
work=$(mktemp -d /tmp/clone-bench.XXXXXX)
loop=
cleanup() {
    umount "$work/mnt" 2>/dev/null || true
    [ -n "$loop" ] && losetup -d "$loop" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
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
mkdir mnt/tree
for d in $(seq 100); do
    mkdir "mnt/tree/d$d"
    for f in $(seq 100); do echo "$d $f" > "mnt/tree/d$d/f$f"; done
done
umount mnt; sleep 1
echo "== unmounted: foliofs cp --reflink=always and foliofs snapshot"
start=$(date +%s%N); "$F" cp --reflink=always big.img:/big big.img:/copy3; end=$(date +%s%N)
echo "foliofs cp --reflink=always of 10 GiB (open, clone, close): $(( (end - start) / 1000 )) us"
start=$(date +%s%N); "$F" snapshot big.img:/tree /tree2; end=$(date +%s%N)
echo "foliofs snapshot of 100 directories of 100 files: $(( (end - start) / 1000 )) us"
rm big.img

echo "== 4 KiB direct overwrites, iodepth 16, 512 MiB files"
"$F" mkfs cow.img --size 4G >/dev/null
"$F" mount cow.img mnt
sleep 1
pid=$(pgrep -f "mount $work/cow.img" | head -1)
written() { awk '/^write_bytes/ {print $2}' "/proc/$pid/io"; }
job() { # name file rw time_based direct
    local before after runtime=
    # A pass that is not time-based runs to its end: every block copied.
    [ "$4" = 1 ] && runtime="--runtime=10 --time_based"
    before=$(written)
    # shellcheck disable=SC2086
    "$FIO" --name="$1" --filename="mnt/$2" --rw="$3" --bs=4k --direct="$5" --ioengine=libaio \
        --iodepth=16 --size=512M $runtime --end_fsync=1 \
        --output-format=terse --terse-version=3 \
        | awk -F';' '{printf "%s: %.0f IOPS, %.0f MiB written by fio", $3, $49, $47 / 1024}'
    after=$(written)
    echo ", $(( (after - before) >> 20 )) MiB by the device"
}
overwrites() {
    job unshared-randwrite plain randwrite 1 1
    job clone-first-pass clone write 0 1
    job clone-randwrite-after clone randwrite 1 1
    job shared-randwrite base randwrite 1 1
    job buffered-unshared-randwrite plain randwrite 1 0
    job buffered-shared-randwrite base2 randwrite 1 0
}
prepare() { # copy-command
    local file
    for file in plain base base2; do
        dd if=/dev/urandom of=mnt/$file bs=4M count=128 conv=fsync status=none
    done
    $1 mnt/base mnt/clone
    $1 mnt/base2 mnt/clone2
    sync mnt/clone mnt/clone2
}
prepare cp
overwrites
umount mnt; sleep 1
"$F" fsck cow.img
rm cow.img

echo "== the same on kernel XFS, reflink=1, loop device with direct I/O"
truncate -s 12G xfs.img
loop=$(losetup --find --show --direct-io=on xfs.img)
mkfs.xfs -q -m reflink=1 "$loop"
mount "$loop" mnt
sectors() { awk '{print $7}' "/sys/block/$(basename "$loop")/stat"; }
written() { echo $(( $(sectors) * 512 )); }
dd if=/dev/zero of=mnt/big bs=4M count=2560 conv=fsync status=none
start=$(date +%s%N); cp --reflink=always mnt/big mnt/copy; end=$(date +%s%N)
echo "cp --reflink=always of 10 GiB: $(( (end - start) / 1000 )) us"
rm mnt/big mnt/copy
prepare "cp --reflink=always"
overwrites
umount mnt
