#!/usr/bin/env bash
# Installs the Debian packages the tests use, when run as root on a machine
# with apt-get and one of them is missing (a no-op otherwise).
#
# A font for the benchmark charts; FUSE and the unmodified programs the mount
# tests drive (fio, xfs_io, sqlite3, flock, setfattr/getfattr,
# setfacl/getfacl); a C compiler for the C example, Python for the Python
# module's tests; the NBD tests' real servers and clients (qemu-nbd, qemu-img,
# qemu-io, nbdkit, nbdinfo, nbdcopy); the virtio-fs test's VM guest (QEMU, a
# Debian kernel, busybox-static and cpio for its initramfs); cbindgen, whose output the committed C
# header must equal (Debian's version is the reference). Kernel peers (loop devices,
# mkfs.ext4/xfs) are needed only by `bench seeds`, which the tests do not run.
set -euo pipefail
packages=(fonts-dejavu-core fuse3 fio xfsprogs sqlite3 util-linux attr acl gcc python3 python3-pip
  python3-venv qemu-utils nbdkit libnbd-bin cbindgen qemu-system-x86 linux-image-amd64 busybox-static cpio)
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  exit 0
fi
if dpkg -s "${packages[@]}" >/dev/null 2>&1; then
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${packages[@]}"
