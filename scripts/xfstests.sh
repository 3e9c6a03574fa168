#!/usr/bin/env bash
# xfstests (fstests) through a foliofs FUSE mount, judged against the list of
# tests that cannot pass through FUSE (tests/xfstests/fuse-limits.list).
#
# usage (as root, from anywhere, after `cargo build --release`):
#   scripts/xfstests.sh                      # the CI slice: tests/xfstests/ci.list
#   scripts/xfstests.sh -g quick             # the quick group (about 40 minutes here)
#   scripts/xfstests.sh generic/451 ...      # given tests
#
# ../shared/tools/xfstests.sh builds the suite, mounts each image with
# `mount -t fuse.foliofs` and writes a per-test status file; this script
# exits 1 when a test fails that fuse-limits.list does not name (and prints
# its diff), and says which listed tests passed (the list should shrink).
# Environment: as ../shared/tools/xfstests.sh (WORK, FOLIOFS, IMG_SIZE,
# FOLIOFS_MOUNT_OPTS), plus RUN_TIMEOUT and TEST_TIMEOUT (seconds, whole run and
# one test).
set -u
repo=$(cd "$(dirname "$0")/.." && pwd)
shared_tool=$repo/../shared/tools/xfstests.sh
limits=$repo/tests/xfstests/fuse-limits.list
export WORK=${WORK:-/tmp/foliofs-xfstests}
export FOLIOFS=${FOLIOFS:-$repo/target/release/foliofs}
[ -f "$shared_tool" ] || { echo "xfstests.sh: $shared_tool not found" >&2; exit 2; }
[ -x "$FOLIOFS" ] || { echo "xfstests.sh: no foliofs at $FOLIOFS (cargo build --release)" >&2; exit 2; }
# Absolute: the suite runs the binary from its own directory (sized mkfs).
FOLIOFS=$(readlink -f "$FOLIOFS")

# Build the suite once, then teach it that a mount of type fuse.foliofs is
# FSTYP=fuse, as upstream does for fuse.glusterfs and fuse.ceph-fuse: root
# mounts foliofs with its subtype in the type (as mount(8) expects for its
# helper), where the suite's sanity check wants the bare "fuse".
bash "$shared_tool" --setup-only >"$WORK.setup.log" 2>&1 || { tail -20 "$WORK.setup.log" >&2; exit 2; }
rc=$WORK/src/common/rc
grep -q "s/fuse.foliofs/fuse/" "$rc" \
	|| sed -i "s|-e 's/fuse.glusterfs/glusterfs/'|-e 's/fuse.foliofs/fuse/' &|" "$rc"
grep -q "s/fuse.foliofs/fuse/" "$rc" || { echo "xfstests.sh: could not patch $rc" >&2; exit 2; }

# The suite cannot make a volume of a given size or block size for FSTYP=fuse
# (those tests were "not run"): teach it to make a foliofs image, and to make
# the scratch image again at the run's size when a sized one is left over.
export FOLIOFS_XFSTESTS_MKFS=$FOLIOFS FOLIOFS_XFSTESTS_SIZE=${IMG_SIZE:-4G}
grep -q "foliofs: sized volumes" "$rc" || cat >>"$rc" <<'RC'

# foliofs: sized volumes (added by the foliofs repository's scripts/xfstests.sh)
if [ "$FSTYP" = fuse ] && [ -n "${FOLIOFS_XFSTESTS_MKFS:-}" ]; then
_foliofs_mkfs() {
	touch "$SCRATCH_DEV.custom"
	"$FOLIOFS_XFSTESTS_MKFS" mkfs "$SCRATCH_DEV" "$@" >/dev/null
}
_try_scratch_mkfs_sized() {
	local fssize=$1 blocksize=${2:-4096}
	[[ $fssize =~ ^[0-9]+$ ]] || _notrun "_scratch_mkfs_sized: fs size \"$fssize\" not an integer."
	_foliofs_mkfs --size "$fssize" --block-size "$blocksize"
}
_scratch_mkfs_blocksized() {
	_foliofs_mkfs --size "$FOLIOFS_XFSTESTS_SIZE" --block-size "$1" \
		|| _notrun "foliofs mkfs --block-size $1 failed"
}
eval "_foliofs_upstream$(declare -f _scratch_mkfs)"
_scratch_mkfs() {
	if [ -e "$SCRATCH_DEV.custom" ]; then
		rm -f "$SCRATCH_DEV.custom"
		"$FOLIOFS_XFSTESTS_MKFS" mkfs "$SCRATCH_DEV" --size "$FOLIOFS_XFSTESTS_SIZE" >/dev/null
		return
	fi
	_foliofs_upstream_scratch_mkfs "$@"
}
fi
RC

# ACL size: the suite knows no limit for FSTYP=fuse (generic/026 was "not
# run"). The kernel's FUSE refuses an ACL larger than a page (fs/fuse/acl.c,
# E2BIG): 4 + 8 n bytes, so 511 entries with 4 KiB pages.
attr=$WORK/src/common/attr
acl_entries_max=$(( ($(getconf PAGESIZE) - 4) / 8 ))
grep -q "foliofs: ACL limit" "$attr" \
	|| sed -i "s|^\tjfs)\$|\tfuse) # foliofs: ACL limit (scripts/xfstests.sh)\n\t\techo $acl_entries_max\n\t\t;;\n&|" "$attr"
grep -q "foliofs: ACL limit" "$attr" || { echo "xfstests.sh: could not patch $attr" >&2; exit 2; }

if [ $# -eq 0 ]; then
	set -- -f "$repo/tests/xfstests/ci.list"
fi
bash "$shared_tool" --timeout "${RUN_TIMEOUT:-3600}" --test-timeout "${TEST_TIMEOUT:-300}" "$@"
status=$?
summary=$WORK/summary.txt
[ $status -eq 0 ] && [ -s "$summary" ] || { echo "xfstests.sh: the run did not finish ($status)" >&2; exit 2; }

listed() { grep -qE "^$1([[:space:]]|#|$)" "$limits"; }
unexpected=
while read -r test state; do
	case "$state" in
	fail) listed "$test" || unexpected="$unexpected $test" ;;
	pass) listed "$test" && echo "xfstests.sh: $test passed but is listed in $limits" >&2 ;;
	esac
done <"$summary"
passed=$(grep -c ' pass$' "$summary"); failed=$(grep -c ' fail$' "$summary")
notrun=$(grep -c ' notrun$' "$summary")
echo "xfstests: $passed passed, $failed failed, $notrun skipped"
if [ -n "$unexpected" ]; then
	echo "xfstests.sh: failures not explained by FUSE:$unexpected" >&2
	exit 1
fi
echo "xfstests.sh: no failure beyond the documented FUSE limits" >&2
