#!/usr/bin/env bash
# The tests: the README's test command, and what .ci/run runs after its
# style, lint and doc checks. Installs what the tests use first (as root).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/test-packages.sh

# FUSE over io_uring is off by default: as root, turn it on so the mount
# tests run over it; the tests turn it on themselves too, and where the
# kernel has no such switch they say they were skipped on uring.
uring_switch=/sys/module/fuse/parameters/enable_uring
if [ "$(id -u)" = 0 ] && [ -e "$uring_switch" ]; then
  echo 1 > "$uring_switch"
fi
# Every crate's tests, the README's library example (a doctest) and the C
# example (crates/foliofs-c/tests) included.
cargo test --workspace
# The fuser fork's own unit tests (it is a patched dependency, not a member).
cargo test --manifest-path vendor/fuser/Cargo.toml --lib
# The mount tests once more over /dev/fuse (the pass above used io_uring).
FOLIOFS_TRANSPORT=dev cargo test -p foliofs-fuse --tests
FOLIOFS_TRANSPORT=dev cargo test -p foliofs-cli --test mount --test mount_posix
# The Python module: `pip install crates/foliofs-py` in a fresh virtual
# environment, then its pytest suite.
scripts/python-tests.sh
