#!/bin/sh
# foliofs serve virtiofs against virtiofsd, the same QEMU guest on each:
# a tree of small files (create, stat, read, delete), 4 KiB random writes
# each fsynced, a sequential 1 MiB write (fsynced) and read back cold.
# virtiofsd serves a directory of kernel ext4 on a loop device; the foliofs
# image lives on that same ext4. Prints seconds per phase and the ratio
# foliofs/virtiofsd (below 1: foliofs is faster). As root, with
# qemu-system-x86_64, busybox-static, cpio, e2fsprogs and virtiofsd
# (cargo install virtiofsd --locked; Debian: libseccomp-dev libcap-ng-dev).
#   FOLIOFS=target/release/foliofs VIRTIOFSD=virtiofsd ACCEL=tcg scripts/virtiofs-bench.sh
# virtiofsd runs with --xattr by default (VIRTIOFSD_ARGS), as foliofs has
# extended attributes: without them the guest stops asking for
# security.capability after the first ENOSYS, where with them it asks
# before every write (Linux 6.1), one round trip more per write.
set -eu
FOLIOFS=${FOLIOFS:-target/release/foliofs}
VIRTIOFSD=${VIRTIOFSD:-virtiofsd}
VIRTIOFSD_ARGS=${VIRTIOFSD_ARGS:---xattr}
ACCEL=${ACCEL:-tcg}
FILES=${FILES:-200}          # small files in the tree
RANDOM_WRITES=${RANDOM_WRITES:-200}
SEQUENTIAL_MIB=${SEQUENTIAL_MIB:-64}
die() { echo "virtiofs-bench: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "run as root (a loop device and mount)"
[ -x "$FOLIOFS" ] || die "$FOLIOFS: no foliofs binary (cargo build --release -p foliofs-cli, or FOLIOFS=...)"
command -v "$VIRTIOFSD" >/dev/null || die "$VIRTIOFSD: not found (cargo install virtiofsd --locked, or VIRTIOFSD=...)"
for tool in qemu-system-x86_64 cpio mkfs.ext4 losetup /bin/busybox; do
    command -v "$tool" >/dev/null || die "$tool: not installed"
done
kernel=$(ls /boot/vmlinuz-* | sort | tail -1)
release=${kernel#/boot/vmlinuz-}
modules=/lib/modules/$release/kernel
work=$(mktemp -d "${TMPDIR:-/var/tmp}/virtiofs-bench.XXXXXX")
loop=
cleanup() {
    [ -n "${server:-}" ] && kill "$server" 2>/dev/null || true
    mountpoint -q "$work/ext4" && umount "$work/ext4"
    [ -n "$loop" ] && losetup -d "$loop"
    rm -rf "$work"
}
trap cleanup EXIT INT TERM

# The guest: busybox, the virtio and fuse modules, the workload as init.
root=$work/root
mkdir -p "$root/bin" "$root/dev" "$root/proc" "$root/sys" "$root/mnt" "$root/modules"
cp /bin/busybox "$root/bin/"
loads=
for module in drivers/virtio/virtio_ring drivers/virtio/virtio drivers/virtio/virtio_pci_legacy_dev \
    drivers/virtio/virtio_pci_modern_dev drivers/virtio/virtio_pci fs/fuse/fuse fs/fuse/virtiofs; do
    name=$(basename "$module")
    if [ -e "$modules/$module.ko" ]; then cp "$modules/$module.ko" "$root/modules/$name.ko"
    elif [ -e "$modules/$module.ko.xz" ]; then xz -dc "$modules/$module.ko.xz" > "$root/modules/$name.ko"
    else continue; fi
    loads="${loads}insmod /modules/$name.ko
"
done
cat > "$root/init" <<INIT
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
$loads
mount -t virtiofs bench /mnt || { echo BENCH-NO-MOUNT; poweroff -f; }
now() { read up idle < /proc/uptime; echo \$up; }
phase() { echo "BENCH \$1 \$(awk "BEGIN { printf \"%.2f\", \$(now) - \$2 }")"; }
cold() { sync; echo 3 > /proc/sys/vm/drop_caches; }
t=\$(now); i=0
while [ \$i -lt $FILES ]; do d=/mnt/tree/d\$((i % 8)); mkdir -p \$d; echo "file \$i" > \$d/f\$i; i=\$((i + 1)); done
phase tree-create \$t; cold
t=\$(now); ls -lR /mnt/tree > /dev/null; phase tree-stat \$t
t=\$(now); cat /mnt/tree/*/* > /dev/null; phase tree-read \$t
t=\$(now); rm -r /mnt/tree; phase tree-delete \$t
dd if=/dev/zero of=/mnt/random bs=1M count=8 conv=fsync 2>/dev/null
t=\$(now); i=0
while [ \$i -lt $RANDOM_WRITES ]; do
  dd if=/dev/urandom of=/mnt/random bs=4k count=1 seek=\$((RANDOM % 2048)) conv=notrunc,fsync 2>/dev/null || echo BENCH-FAILED
  i=\$((i + 1))
done
phase random-4k-fsync \$t
t=\$(now); dd if=/dev/zero of=/mnt/sequential bs=1M count=$SEQUENTIAL_MIB conv=fsync 2>/dev/null; phase sequential-write \$t
cold
t=\$(now); dd if=/mnt/sequential of=/dev/null bs=1M 2>/dev/null; phase sequential-read \$t
umount /mnt
poweroff -f
INIT
chmod +x "$root/init"
(cd "$root" && find . | cpio -o -H newc --quiet > "$work/initramfs.cpio")

# Kernel ext4 on a loop device: virtiofsd's directory and foliofs's image.
truncate -s 1G "$work/ext4.img"
loop=$(losetup -f --show "$work/ext4.img")
mkfs.ext4 -q "$loop"
mkdir -p "$work/ext4"
mount "$loop" "$work/ext4"
mkdir "$work/ext4/shared"
"$FOLIOFS" mkfs "$work/ext4/foliofs.img" --size 512M >/dev/null

guest() { # SOCKET -> the BENCH lines on the console
    nice -n 19 qemu-system-x86_64 -machine "q35,accel=$ACCEL" -cpu max -smp 2 -m 512M \
        -nographic -no-reboot \
        -object memory-backend-memfd,id=mem,size=512M,share=on -numa node,memdev=mem \
        -chardev "socket,id=char0,path=$1" \
        -device vhost-user-fs-pci,queue-size=1024,chardev=char0,tag=bench \
        -kernel "$kernel" -initrd "$work/initramfs.cpio" -append "console=ttyS0 quiet panic=-1" \
        </dev/null 2>>"$work/qemu.log" | tr -d '\r' | grep -o 'BENCH .*'
}
wait_socket() { i=0; while [ ! -S "$1" ]; do sleep 0.1; i=$((i + 1)); [ $i -lt 200 ] || die "no socket $1"; done; }

nice -n 19 "$FOLIOFS" serve virtiofs "$work/ext4/foliofs.img" --socket "$work/foliofs.sock" 2>"$work/foliofs.log" &
server=$!; wait_socket "$work/foliofs.sock"
guest "$work/foliofs.sock" > "$work/foliofs.txt"
wait "$server" || die "foliofs serve virtiofs failed: $(cat "$work/foliofs.log")"
nice -n 19 "$VIRTIOFSD" --socket-path "$work/virtiofsd.sock" --shared-dir "$work/ext4/shared" \
    --cache auto --sandbox none $VIRTIOFSD_ARGS 2>"$work/virtiofsd.log" &
server=$!; wait_socket "$work/virtiofsd.sock"
guest "$work/virtiofsd.sock" > "$work/virtiofsd.txt"
wait "$server" || true
server=
grep -q FAILED "$work/foliofs.txt" "$work/virtiofsd.txt" && die "a guest write failed"

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')
echo "virtio-fs guest (QEMU $ACCEL, 2 vCPUs, Linux $release) on $cpu, $(nproc) host cores"
echo "foliofs: $FOLIOFS; virtiofsd: $("$VIRTIOFSD" --version) $VIRTIOFSD_ARGS; $FILES files, $RANDOM_WRITES fsynced 4 KiB writes, $SEQUENTIAL_MIB MiB"
echo
echo "| phase | foliofs s | virtiofsd s | foliofs/virtiofsd |"
echo "|---|---|---|---|"
while read -r _ phase seconds; do
    peer=$(awk -v p="$phase" '$2 == p { print $3 }' "$work/virtiofsd.txt")
    awk -v p="$phase" -v f="$seconds" -v v="$peer" \
        'BEGIN { printf "| %s | %.2f | %.2f | %s |\n", p, f, v, (v > 0 ? sprintf("%.2f", f / v) : "n/a") }'
done < "$work/foliofs.txt"
